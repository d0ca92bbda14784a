"""The Nomad job files agree with docker-compose.yml.

Parses deploy/nomad/*.nomad.hcl with an HCL2 parser (python-hcl2) and
docker-compose.yml with a YAML parser, and checks, for every compose service
that runs an image (one-shot set-up services aside): a Nomad task of the same
name runs the same image, entrypoint and arguments; every environment
variable compose sets is set (from the task's `env`, with the same value, or
rendered by a template from service discovery); what compose publishes, the
group's network publishes on the same port; compose's replicas are the
group's count; a service compose health-checks has a Nomad check; and every
job has an update strategy. Exits non-zero with one line per disagreement.

Usage: python check_nomad.py <repo>
"""

import re
import sys
from pathlib import Path

import hcl2
import yaml

# Compose services that only prepare a volume once (Nomad: host volumes).
ONE_SHOT = {"secrets", "pg-tls"}


def blocks(node, kind):
    """The named blocks `kind "name" { }` of a parsed body, as (name, body)."""
    out = []
    for entry in node.get(kind, []):
        for name, body in entry.items():
            out.append((name, body))
    return out


def resolve(value, variables):
    """A value with `${var.x}` replaced by the variable's default."""
    if isinstance(value, str):
        m = re.fullmatch(r"\$\{var\.([a-z_]+)\}", value)
        if m:
            return variables.get(m.group(1), value)
    return value


def nomad_tasks(repo):
    """Every task of every job: name -> (group body, task body, variables)."""
    tasks = {}
    problems = []
    for path in sorted((repo / "deploy" / "nomad").glob("*.nomad.hcl")):
        with open(path) as f:
            parsed = hcl2.load(f)
        variables = {name: body.get("default") for name, body in blocks(parsed, "variable")}
        for job_name, job in blocks(parsed, "job"):
            if not job.get("update"):
                problems.append(f"{path.name}: job {job_name} has no update strategy")
            for group_name, group in blocks(job, "group"):
                for task_name, task in blocks(group, "task"):
                    tasks[task_name] = (group, task, variables, path.name)
    return tasks, problems


def env_of(task):
    """The task's static env and the keys its env templates render."""
    static = {}
    for e in task.get("env", []):
        static.update({k: str(v) for k, v in e.items()})
    rendered = set()
    for t in task.get("template", []):
        if t.get("env"):
            rendered.update(re.findall(r"\b([A-Z][A-Z0-9_]+)=", t.get("data", "")))
    return static, rendered


def published_ports(service):
    """The container ports compose publishes (`ip:host:container`), each
    with whether it binds to loopback only."""
    out = set()
    for p in service.get("ports", []):
        parts = str(p).split(":")
        out.add((int(parts[-1].split("/")[0]), len(parts) == 3 and parts[0] == "127.0.0.1"))
    return out


def nomad_ports(group):
    out = set()
    for net in group.get("network", []):
        for _, port in blocks(net, "port"):
            if "static" in port:
                loopback = port.get("host_network") == "loopback"
                out.add((int(port.get("to", port["static"])), loopback))
    return out


def has_check(group):
    for svc in group.get("service", []):
        if svc.get("check"):
            return True
    return False


def dockerfile_entrypoint(repo):
    ep = None
    for line in (repo / "Dockerfile").read_text().splitlines():
        if line.startswith("ENTRYPOINT"):
            ep = yaml.safe_load(line[len("ENTRYPOINT"):].strip())
    return ep


def main(repo):
    repo = Path(repo)
    compose = yaml.safe_load((repo / "docker-compose.yml").read_text())
    tasks, problems = nomad_tasks(repo)
    default_entrypoint = dockerfile_entrypoint(repo)
    checked = 0
    for name, svc in compose["services"].items():
        if name in ONE_SHOT:
            continue
        if name not in tasks:
            problems.append(f"compose service {name} has no Nomad task")
            continue
        group, task, variables, file = tasks[name]
        config = task.get("config", [{}])[0]
        where = f"{file}: task {name}"
        image = resolve(config.get("image"), variables)
        if image != svc.get("image"):
            problems.append(f"{where}: image {image!r}, compose {svc.get('image')!r}")
        ours = svc.get("image", "").startswith("better-compute-metal")
        entrypoint = svc.get("entrypoint", default_entrypoint if ours else None)
        if config.get("entrypoint") != entrypoint:
            problems.append(f"{where}: entrypoint {config.get('entrypoint')!r}, compose {entrypoint!r}")
        if (config.get("args") or None) != (svc.get("command") or None):
            problems.append(f"{where}: args {config.get('args')!r}, compose command {svc.get('command')!r}")
        static, rendered = env_of(task)
        for key, value in (svc.get("environment") or {}).items():
            if key in static:
                if static[key] != str(value):
                    problems.append(f"{where}: {key}={static[key]!r}, compose {value!r}")
            elif key not in rendered:
                problems.append(f"{where}: compose sets {key}, Nomad does not")
        missing = published_ports(svc) - nomad_ports(group)
        if missing:
            problems.append(
                f"{where}: compose publishes {sorted(missing)} (port, loopback only), the group does not"
            )
        replicas = (svc.get("deploy") or {}).get("replicas", 1)
        count = resolve(group.get("count", 1), variables)
        if count != replicas:
            problems.append(f"{where}: count {count}, compose replicas {replicas}")
        if svc.get("healthcheck") and not has_check(group):
            problems.append(f"{where}: compose health-checks it, Nomad does not")
        if svc.get("network_mode") == "host" and config.get("network_mode") != "host":
            problems.append(f"{where}: compose runs it on the host's network, Nomad does not")
        checked += 1
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"nomad: {checked} services agree with docker-compose.yml ({len(tasks)} tasks)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
