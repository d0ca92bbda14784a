# What Better Compute Metal runs on, for a Nomad cluster without its own:
# NATS JetStream (with the generated authorization), Postgres (TLS) and
# Jaeger (OTLP in), registered as the Nomad services `nats`, `postgres` and
# `jaeger` that deploy/nomad/bcm.nomad.hcl discovers. Same images as
# docker-compose.yml (CI checks it). A production cluster usually brings
# its own Postgres and collector; then only bcm.nomad.hcl is needed.

job "bcm-infra" {
  datacenters = ["dc1"]
  type        = "service"

  update {
    max_parallel     = 1
    health_check     = "checks"
    min_healthy_time = "10s"
    healthy_deadline = "3m"
    auto_revert      = true
  }

  group "nats" {
    network {
      port "client" {
        static       = 4222
        to           = 4222
        host_network = "loopback"
      }
      port "monitor" {
        to = 8222
      }
    }

    volume "secrets" {
      type      = "host"
      source    = "bcm-secrets"
      read_only = true
    }

    service {
      name     = "nats"
      port     = "client"
      provider = "nomad"

      check {
        type     = "http"
        port     = "monitor"
        path     = "/healthz"
        interval = "5s"
        timeout  = "3s"
      }
    }

    task "nats" {
      driver = "docker"

      config {
        image = "nats:2.10-alpine"
        args  = ["-c", "/var/lib/bcm-secrets/nats.conf"]
        ports = ["client", "monitor"]
      }

      volume_mount {
        volume      = "secrets"
        destination = "/var/lib/bcm-secrets"
        read_only   = true
      }
    }
  }

  group "postgres" {
    network {
      # Static: the secrets' database URL names postgres:5432.
      port "pg" {
        static = 5432
        to     = 5432
      }
    }

    volume "secrets" {
      type      = "host"
      source    = "bcm-secrets"
      read_only = true
    }

    volume "data" {
      type   = "host"
      source = "bcm-pg-data"
    }

    service {
      name     = "postgres"
      port     = "pg"
      provider = "nomad"

      check {
        type     = "tcp"
        interval = "5s"
        timeout  = "3s"
      }
    }

    # Postgres reads its key only if it owns it: a one-shot copy, as root,
    # of the generated certificate and key into the allocation's directory
    # (compose: the `pg-tls` service).
    task "pg-tls" {
      driver = "docker"
      user   = "root"

      lifecycle {
        hook    = "prestart"
        sidecar = false
      }

      config {
        image      = "postgres:16"
        entrypoint = ["/bin/sh", "-c", "mkdir -p /alloc/pg-tls && install -o postgres -g postgres -m 0600 /var/lib/bcm-secrets/pg-tls/api.key /alloc/pg-tls/server.key && install -o postgres -g postgres -m 0644 /var/lib/bcm-secrets/pg-tls/api.crt /alloc/pg-tls/server.crt"]
      }

      volume_mount {
        volume      = "secrets"
        destination = "/var/lib/bcm-secrets"
        read_only   = true
      }
    }

    task "postgres" {
      driver = "docker"

      config {
        image = "postgres:16"
        args  = ["postgres", "-c", "max_connections=200", "-c", "ssl=on", "-c", "ssl_cert_file=/pg-tls/server.crt", "-c", "ssl_key_file=/pg-tls/server.key"]
        ports = ["pg"]
        mount {
          type     = "bind"
          source   = "../alloc/pg-tls"
          target   = "/pg-tls"
          readonly = true
        }
      }

      volume_mount {
        volume      = "secrets"
        destination = "/var/lib/bcm-secrets"
        read_only   = true
      }

      volume_mount {
        volume      = "data"
        destination = "/var/lib/postgresql/data"
      }

      env {
        POSTGRES_USER          = "bcm"
        POSTGRES_PASSWORD_FILE = "/var/lib/bcm-secrets/pg-password"
        POSTGRES_DB            = "bcm"
      }
    }
  }

  group "jaeger" {
    network {
      port "otlp" {
        to = 4318
      }
      # The UI has no authentication: loopback only, as in compose.
      port "ui" {
        static       = 16686
        to           = 16686
        host_network = "loopback"
      }
    }

    service {
      name     = "jaeger"
      port     = "otlp"
      provider = "nomad"

      check {
        type     = "tcp"
        interval = "5s"
        timeout  = "3s"
      }
    }

    task "jaeger" {
      driver = "docker"

      config {
        image = "jaegertracing/all-in-one:1.57"
        ports = ["otlp", "ui"]
      }

      env {
        COLLECTOR_OTLP_ENABLED = "true"
      }
    }
  }
}
