//! `inventory`: what the machine is, read from `/proc` and `/sys` (and
//! `dmidecode` where the DMI tables are not in sysfs): CPUs, memory, disks,
//! NICs with MAC and link state, and the system's vendor, model, serial
//! and UUID.

use std::path::PathBuf;

use bcm_contracts::outputs::{Inventory, NicInfo, SystemInfo};

use crate::disks;

fn dmidecode(key: &str) -> Option<String> {
    let out = std::process::Command::new("dmidecode")
        .args(["-s", key])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| disks::clean(&String::from_utf8_lossy(&out.stdout)))
        .flatten()
}

fn dmi(file: &str, key: &str) -> Option<String> {
    disks::sys(format!("/sys/class/dmi/id/{file}")).or_else(|| dmidecode(key))
}

/// CPU count and model from `/proc/cpuinfo`.
pub fn cpus(cpuinfo: &str) -> (usize, String) {
    let count = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, m)| m.trim().to_owned())
        .unwrap_or_default();
    (count, model)
}

/// `MemTotal` in MiB from `/proc/meminfo`.
pub fn memory_mib(meminfo: &str) -> u64 {
    meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb / 1024)
        .unwrap_or(0)
}

fn nics() -> Vec<NicInfo> {
    let mut out = vec![];
    let Ok(entries) = std::fs::read_dir("/sys/class/net") else {
        return out;
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for name in names {
        let base = PathBuf::from("/sys/class/net").join(&name);
        if name == "lo" || !base.join("device").exists() {
            continue; // virtual interfaces are not the machine's NICs
        }
        out.push(NicInfo {
            mac: disks::sys(base.join("address")).unwrap_or_default(),
            link: disks::sys(base.join("operstate")).unwrap_or_else(|| "unknown".into()),
            speed_mbps: disks::sys(base.join("speed"))
                .and_then(|s| s.parse::<i64>().ok())
                .filter(|s| *s > 0),
            driver: std::fs::read_link(base.join("device/driver"))
                .ok()
                .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned())),
            name,
        });
    }
    out
}

/// The whole inventory; `disks` as bcd was told to see them.
pub fn collect(explicit_disks: &[PathBuf]) -> Inventory {
    let (cpu_count, cpu_model) = cpus(&disks::sys("/proc/cpuinfo").unwrap_or_default());
    let disks = disks::discover(explicit_disks)
        .map(|ds| ds.iter().map(disks::Disk::info).collect())
        .unwrap_or_default();
    Inventory {
        system: SystemInfo {
            vendor: dmi("sys_vendor", "system-manufacturer"),
            model: dmi("product_name", "system-product-name"),
            serial: dmi("product_serial", "system-serial-number"),
            uuid: dmi("product_uuid", "system-uuid"),
        },
        cpus: cpu_count as u64,
        cpu_model,
        memory_mib: memory_mib(&disks::sys("/proc/meminfo").unwrap_or_default()),
        disks,
        nics: nics(),
        kernel: disks::sys("/proc/sys/kernel/osrelease"),
        sim: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpuinfo_and_meminfo() {
        let cpuinfo = "processor\t: 0\nmodel name\t: QEMU Virtual CPU\n\nprocessor\t: 1\nmodel name\t: QEMU Virtual CPU\n";
        assert_eq!(cpus(cpuinfo), (2, "QEMU Virtual CPU".to_owned()));
        assert_eq!(
            memory_mib("MemTotal:        2048000 kB\nMemFree: 1 kB\n"),
            2000
        );
        assert_eq!(memory_mib("garbage"), 0);
    }

    #[test]
    fn this_machine_s_inventory_is_real() {
        let inv = collect(&[]);
        let (count, _) = cpus(&std::fs::read_to_string("/proc/cpuinfo").expect("cpuinfo"));
        assert_eq!(inv.cpus, count as u64);
        assert!(inv.memory_mib > 0);
        // What bcd reports is what the contract decodes.
        let wire = serde_json::to_value(&inv).expect("json");
        assert!(
            bcm_contracts::Output::decode(bcm_contracts::CommandKind::Inventory, &wire).is_ok()
        );
    }
}
