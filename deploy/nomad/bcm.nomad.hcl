# Better Compute Metal's control plane on Nomad: the same services, image,
# commands and environment as docker-compose.yml (CI checks that they
# agree: tests/deploy/check_nomad.py), one group per service.
#
# Before the first run, on every client that runs these groups:
#   - the image `better-compute-metal:dev` (`docker build -t better-compute-metal:dev .`);
#   - the secrets, generated once by deploy/compose/init-secrets.sh into a
#     host volume `bcm-secrets` (client config: host_volume "bcm-secrets"
#     { path = "/var/lib/bcm-secrets" read_only = true }) — no secret is in
#     this file;
#   - NATS (with the generated authorization, nats.conf), Postgres (TLS) and
#     Jaeger registered as Nomad services `nats`, `postgres` and `jaeger`
#     (deploy/nomad/infra.nomad.hcl runs them).
# Names: as in compose, the services reach `postgres`, `nats`, `api` and
# `jaeger` by name — the generated certificates name them (Postgres is
# verified with verify-full against `postgres`, the API against `api`), and
# the secrets' database URL says `postgres:5432`. Make the names resolve on
# the clients: Consul DNS, or the variable `hosts` (e.g.
# `-var 'hosts=["postgres:10.0.0.5","nats:10.0.0.5","api:10.0.0.6","jaeger:10.0.0.5"]'`),
# which every task gets as extra /etc/hosts entries. The bus and the trace
# collector are also found through Nomad service discovery (templates).
# What is published binds to the client's `loopback` host network (client
# config: host_network "loopback" { cidr = "127.0.0.1/32" }), as compose
# binds to 127.0.0.1.
# Run `nomad job run` from deploy/nomad: file() reads the configurations
# relative to the working directory.
# The reconciler group's `count` is the scale knob: workers share the
# nodes' shards through leases. The Nomad binary is not available under an
# open licence on the machines this is developed on: the file follows the
# documented job specification and is parsed (HCL2) and cross-checked in
# CI, not run there.

variable "image" {
  type    = string
  default = "better-compute-metal:dev"
}

variable "hosts" {
  type        = list(string)
  default     = []
  description = "Extra /etc/hosts entries (name:address) for postgres, nats, api and jaeger, where no DNS resolves them."
}

variable "reconcilers" {
  type        = number
  default     = 2
  description = "Reconciler workers (compose: deploy.replicas)."
}

job "bcm" {
  datacenters = ["dc1"]
  type        = "service"

  # Replace one allocation at a time, only once the new one is healthy;
  # roll back a deployment that does not become healthy.
  update {
    max_parallel      = 1
    health_check      = "checks"
    min_healthy_time  = "10s"
    healthy_deadline  = "3m"
    progress_deadline = "10m"
    auto_revert       = true
  }

  group "api" {
    count = 1

    network {
      port "http" {
        static       = 8080
        to           = 8080
        host_network = "loopback"
      }
    }

    volume "secrets" {
      type      = "host"
      source    = "bcm-secrets"
      read_only = true
    }

    service {
      name     = "bcm-api"
      port     = "http"
      provider = "nomad"

      check {
        name     = "readyz"
        type     = "http"
        protocol = "https"
        path     = "/readyz"
        interval = "5s"
        timeout  = "3s"
        # The API's certificate is the generated local CA's.
        tls_skip_verify = true
      }
    }

    task "api" {
      driver = "docker"
      # Its drain at a stop is at most 10 s (bcm_telemetry::signals::DRAIN).
      kill_timeout = "15s"

      config {
        image      = var.image
        extra_hosts = var.hosts
        entrypoint = ["/usr/local/bin/bcm-api"]
        args       = ["--config", "/etc/bcm/api.toml"]
        ports      = ["http"]
        mount {
          type     = "bind"
          source   = "local/api.toml"
          target   = "/etc/bcm/api.toml"
          readonly = true
        }
      }

      volume_mount {
        volume      = "secrets"
        destination = "/var/lib/bcm-secrets"
        read_only   = true
      }

      env {
        BCM_API_SECRETS = "/var/lib/bcm-secrets/api.toml"
      }

      template {
        data        = file("../config/api.compose.toml")
        destination = "local/api.toml"
      }

      # Where the bus and the trace collector are, from service discovery.
      template {
        destination = "local/discovered.env"
        env         = true
        data        = <<EOT
{{ range nomadService "nats" }}BCM_API_BUS__URL=nats://{{ .Address }}:{{ .Port }}{{ end }}
{{ range nomadService "jaeger" }}BCM_API_TELEMETRY__OTLP_ENDPOINT=http://{{ .Address }}:{{ .Port }}/v1/traces{{ end }}
EOT
      }

      resources {
        cpu    = 500
        memory = 256
      }
    }
  }

  group "workflow" {
    count = 1

    volume "secrets" {
      type      = "host"
      source    = "bcm-secrets"
      read_only = true
    }

    task "workflow" {
      driver = "docker"
      # Its drain at a stop is at most 10 s (bcm_telemetry::signals::DRAIN).
      kill_timeout = "15s"

      config {
        image      = var.image
        extra_hosts = var.hosts
        entrypoint = ["/usr/local/bin/bcm-workflow"]
      }

      volume_mount {
        volume      = "secrets"
        destination = "/var/lib/bcm-secrets"
        read_only   = true
      }

      env {
        # The name the API's certificate carries (and agents use).
        BCM_WORKFLOW_ENGINE__CONTROL_PLANE_URL = "https://api:8080"
        BCM_WORKFLOW_SECRETS                   = "/var/lib/bcm-secrets/workflow.toml"
        BCM_WORKFLOW_TELEMETRY__METRICS_LISTEN = "0.0.0.0:9464"
      }

      template {
        destination = "local/discovered.env"
        env         = true
        data        = <<EOT
{{ range nomadService "nats" }}BCM_WORKFLOW_BUS__URL=nats://{{ .Address }}:{{ .Port }}{{ end }}
{{ range nomadService "jaeger" }}BCM_WORKFLOW_TELEMETRY__OTLP_ENDPOINT=http://{{ .Address }}:{{ .Port }}/v1/traces{{ end }}
EOT
      }

      resources {
        cpu    = 500
        memory = 256
      }
    }
  }

  group "reconciler" {
    # The scale knob: any number of workers share the shards.
    count = var.reconcilers

    volume "secrets" {
      type      = "host"
      source    = "bcm-secrets"
      read_only = true
    }

    task "reconciler" {
      driver = "docker"
      # Its drain at a stop is at most 10 s (bcm_telemetry::signals::DRAIN).
      kill_timeout = "15s"

      config {
        image      = var.image
        extra_hosts = var.hosts
        entrypoint = ["/usr/local/bin/bcm-reconciler"]
      }

      volume_mount {
        volume      = "secrets"
        destination = "/var/lib/bcm-secrets"
        read_only   = true
      }

      env {
        BCM_RECONCILER_SECRETS                   = "/var/lib/bcm-secrets/reconciler.toml"
        BCM_RECONCILER_TELEMETRY__METRICS_LISTEN = "0.0.0.0:9464"
      }

      template {
        destination = "local/discovered.env"
        env         = true
        data        = <<EOT
{{ range nomadService "nats" }}BCM_RECONCILER_BUS__URL=nats://{{ .Address }}:{{ .Port }}{{ end }}
{{ range nomadService "jaeger" }}BCM_RECONCILER_TELEMETRY__OTLP_ENDPOINT=http://{{ .Address }}:{{ .Port }}/v1/traces{{ end }}
EOT
      }

      resources {
        cpu    = 300
        memory = 128
      }
    }
  }

  group "attestation" {
    count = 1

    volume "secrets" {
      type      = "host"
      source    = "bcm-secrets"
      read_only = true
    }

    # The node CA's key lives here, generated at the first start.
    volume "pki" {
      type      = "host"
      source    = "bcm-pki"
      read_only = false
    }

    task "attestation" {
      driver = "docker"
      # Its drain at a stop is at most 10 s (bcm_telemetry::signals::DRAIN).
      kill_timeout = "15s"

      config {
        image      = var.image
        extra_hosts = var.hosts
        entrypoint = ["/usr/local/bin/bcm-attestation"]
      }

      volume_mount {
        volume      = "secrets"
        destination = "/var/lib/bcm-secrets"
        read_only   = true
      }

      volume_mount {
        volume      = "pki"
        destination = "/var/lib/bcm-pki"
      }

      env {
        BCM_ATTEST_SECRETS                  = "/var/lib/bcm-secrets/attestation.toml"
        BCM_ATTEST_ATTESTATION__CA_CERT_FILE = "/var/lib/bcm-pki/ca.pem"
        BCM_ATTEST_ATTESTATION__CA_KEY_FILE  = "/var/lib/bcm-pki/ca.key"
        BCM_ATTEST_ATTESTATION__GENERATE_CA  = "true"
        BCM_ATTEST_TELEMETRY__METRICS_LISTEN = "0.0.0.0:9464"
      }

      template {
        destination = "local/discovered.env"
        env         = true
        data        = <<EOT
{{ range nomadService "nats" }}BCM_ATTEST_BUS__URL=nats://{{ .Address }}:{{ .Port }}{{ end }}
{{ range nomadService "jaeger" }}BCM_ATTEST_TELEMETRY__OTLP_ENDPOINT=http://{{ .Address }}:{{ .Port }}/v1/traces{{ end }}
EOT
      }

      resources {
        cpu    = 300
        memory = 128
      }
    }
  }

  # A simulated site `local` for trying the stack without machines.
  group "sim" {
    count = 1

    volume "secrets" {
      type      = "host"
      source    = "bcm-secrets"
      read_only = true
    }

    task "sim" {
      driver = "docker"
      # Its drain at a stop is at most 10 s (bcm_telemetry::signals::DRAIN).
      kill_timeout = "15s"

      config {
        image      = var.image
        extra_hosts = var.hosts
        entrypoint = ["/usr/local/bin/bcm"]
        args       = ["--services", "sim", "--sim-machines", "0", "--config", "/etc/bcm/bcm.toml"]
        mount {
          type     = "bind"
          source   = "local/bcm.toml"
          target   = "/etc/bcm/bcm.toml"
          readonly = true
        }
      }

      volume_mount {
        volume      = "secrets"
        destination = "/var/lib/bcm-secrets"
        read_only   = true
      }

      env {
        BCM_ALL_SECRETS = "/var/lib/bcm-secrets/sim.toml"
      }

      template {
        destination = "local/discovered.env"
        env         = true
        data        = <<EOT
{{ range nomadService "nats" }}BCM_ALL_API__BUS__URL=nats://{{ .Address }}:{{ .Port }}{{ end }}
EOT
      }

      template {
        data        = file("../config/bcm.compose.toml")
        destination = "local/bcm.toml"
      }

      resources {
        cpu    = 300
        memory = 128
      }
    }
  }

  # Real machines of site `lab`: the bmc service (Redfish, IPMI) and the
  # boot service (DHCP, TFTP and HTTP on the host's boot interface, so host
  # networking). Compose runs them under its `lab` profile.
  group "bmc" {
    count = 1

    volume "secrets" {
      type      = "host"
      source    = "bcm-secrets"
      read_only = true
    }

    task "bmc" {
      driver = "docker"
      # Its drain at a stop is at most 10 s (bcm_telemetry::signals::DRAIN).
      kill_timeout = "15s"

      config {
        image      = var.image
        extra_hosts = var.hosts
        entrypoint = ["/usr/local/bin/bcm-bmc"]
        args       = ["--config", "/etc/bcm/bmc.toml"]
        mount {
          type     = "bind"
          source   = "local/bmc.toml"
          target   = "/etc/bcm/bmc.toml"
          readonly = true
        }
      }

      volume_mount {
        volume      = "secrets"
        destination = "/var/lib/bcm-secrets"
        read_only   = true
      }

      env {
        BCM_BMC_SECRETS                   = "/var/lib/bcm-secrets/bmc.toml"
        BCM_BMC_TELEMETRY__METRICS_LISTEN = "0.0.0.0:9464"
      }

      template {
        data        = file("../config/bmc.compose.toml")
        destination = "local/bmc.toml"
      }

      resources {
        cpu    = 300
        memory = 128
      }
    }
  }

  group "boot" {
    count = 1

    volume "secrets" {
      type      = "host"
      source    = "bcm-secrets"
      read_only = true
    }

    task "boot" {
      driver = "docker"
      # Its drain at a stop is at most 10 s (bcm_telemetry::signals::DRAIN).
      kill_timeout = "15s"
      user   = "root"

      config {
        image        = var.image
        extra_hosts  = var.hosts
        network_mode = "host"
        entrypoint   = ["/usr/local/bin/bcm-boot"]
        args         = ["--config", "/etc/bcm/boot.toml"]
        mount {
          type     = "bind"
          source   = "local/boot.toml"
          target   = "/etc/bcm/boot.toml"
          readonly = true
        }
      }

      volume_mount {
        volume      = "secrets"
        destination = "/var/lib/bcm-secrets"
        read_only   = true
      }

      env {
        BCM_BOOT_SECRETS = "/var/lib/bcm-secrets/boot.toml"
      }

      template {
        data        = file("../config/boot.compose.toml")
        destination = "local/boot.toml"
      }

      resources {
        cpu    = 300
        memory = 256
      }
    }
  }
}
