//! `bcd`, the on-machine agent. `bcd ramdisk` runs in the inspection
//! ramdisk: it joins with the token on its kernel command line and runs
//! `inventory`, `disk.wipe`, `deploy.image` (with the profile's user data
//! as a NoCloud seed on the installed root), `boot.kexec` and `diag.dcgm`,
//! posting node-signed results. `bcd node` is the installed OS's (or an
//! adopted machine's) agent: it keeps its identity, rejoins with it after
//! every boot and renews it, and runs an adopted machine's own commands
//! (`node.wipe`, `node.powerOff`: it has no BMC to boot it a ramdisk). One static binary; besides the kernel it needs
//! nothing a minimal initramfs lacks.

pub mod agent;
pub mod cmdline;
pub mod dcgm;
pub mod disks;
pub mod image;
pub mod inventory;
pub mod kexec;
pub mod mounts;
pub mod nvme;
pub mod offload;
pub mod qcow2;
pub mod seed;
pub mod sgio;
pub mod state;
pub mod wipe;
