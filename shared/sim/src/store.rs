//! What the simulated site must not forget when its process restarts,
//! because a real site would not: each machine's power, boot device,
//! installed disk and what it booted — with its running ramdisk agent's key
//! and session — and the boot service's entries (bucket `BCM_SIM_<site>`); the
//! site commands it executed and the results its agents posted, by command
//! id (bucket `BCM_SIM_RUNS_<site>`, each record dropped once its command
//! could no longer be delivered), so a redelivered command is answered from
//! the record and never run twice. A restart of the site process is then
//! what it is at a real site — the control plane's services going away and
//! coming back — not a power loss of the whole fleet.
//!
//! Without buckets ([`SiteStore::memory`], unit tests) nothing is kept.

use bcm_bus::kv::{key_token, Bucket};
use bcm_bus::{Bus, BusError};
use bcm_contracts::agent::AgentResult;
use bcm_contracts::CommandResult;
use serde::{Deserialize, Serialize};

use crate::agent::BootParams;

/// What is installed on a simulated disk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Disk {
    pub join_token: String,
    pub api: String,
    /// The installed OS agent's ed25519 secret key (base64), kept before
    /// it joins: a join retried across a site restart holds the same key.
    #[serde(default)]
    pub key: Option<String>,
    pub session: Option<String>,
    /// The node it joined as (kept with the session).
    #[serde(default)]
    pub node: Option<String>,
}

/// The ramdisk agent a machine runs: its key (it never leaves the
/// machine's memory — which, for a simulated machine, is this record) and
/// session once joined.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RamdiskAgent {
    /// The ed25519 secret key, base64.
    pub key: String,
    pub node_id: Option<String>,
    pub session: Option<String>,
}

/// What a powered-on machine booted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "booted", deny_unknown_fields)]
pub enum Booted {
    /// The ramdisk of a boot entry.
    Ramdisk {
        params: BootParams,
        agent: Option<RamdiskAgent>,
    },
    /// PXE through the real boot service whose proxy DHCP (PXE port) is
    /// here.
    AskBootService { dhcp: std::net::SocketAddr },
    /// The installed OS.
    Os,
    /// An agentless deploy's installer, booted from the virtual CD: it
    /// writes `image` to the disk and powers the machine off (its
    /// hand-off; it runs no agent).
    Installer { image: String },
    /// What an agentless installer wrote: an OS that runs no agent.
    AgentlessOs,
}

/// One machine as kept.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MachineRecord {
    pub power_on: bool,
    pub pxe: bool,
    pub pxe_persistent: bool,
    pub disk: Option<Disk>,
    /// The node the control plane knows this machine as.
    pub node: Option<String>,
    pub booted: Option<Booted>,
    /// The image in the BMC's virtual CD.
    #[serde(default)]
    pub media: Option<String>,
    /// The next boot is from the virtual CD (`cd_persistent`: every boot).
    #[serde(default)]
    pub cd: bool,
    #[serde(default)]
    pub cd_persistent: bool,
    /// The image an agentless installer wrote to the disk.
    #[serde(default)]
    pub installed: Option<String>,
}

/// A site command's run, recorded before it runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "run", deny_unknown_fields)]
pub enum CommandRun {
    /// Begun; the site died before it recorded the result.
    Started,
    /// Done, with the result published (or to publish again).
    Done { result: Box<CommandResult> },
}

/// The buckets (or nothing).
#[derive(Clone, Debug, Default)]
pub struct SiteStore {
    buckets: Option<(Bucket, Bucket)>,
}

/// Machine records: `m.<address>`; boot entries: `b.<mac>`.
fn machine_key(address: &str) -> String {
    format!("m.{}", key_token(address))
}
fn entry_key(mac: &str) -> String {
    format!("b.{}", key_token(&mac.to_ascii_lowercase()))
}

impl SiteStore {
    /// Keeps nothing.
    pub fn memory() -> Self {
        Self::default()
    }

    /// The site's buckets on `bus`, created if missing.
    pub async fn open(bus: &Bus, site: &bcm_core::SiteId) -> Result<Self, BusError> {
        let state = Bucket::open(bus, &bus.subjects().kv_bucket("sim", site)).await?;
        // Run records are needed while their command can be delivered
        // again, and no longer; an agent command's record (and result)
        // while its step runs, which for a simulated machine is far less.
        let runs = Bucket::open_expiring(
            bus,
            &bus.subjects().kv_bucket("sim_runs", site),
            bcm_bus::streams::COMMAND_RETENTION,
        )
        .await?;
        Ok(Self {
            buckets: Some((state, runs)),
        })
    }

    /// Whether anything is kept.
    pub fn is_durable(&self) -> bool {
        self.buckets.is_some()
    }

    /// Every machine kept, by address, and every boot entry, by MAC.
    #[allow(clippy::type_complexity)]
    pub async fn load(
        &self,
    ) -> Result<(Vec<(String, MachineRecord)>, Vec<(String, String)>), BusError> {
        let Some((state, _)) = &self.buckets else {
            return Ok((vec![], vec![]));
        };
        let machines = state
            .scan::<Keyed<MachineRecord>>("m.")
            .await?
            .into_iter()
            .map(|(_, k)| (k.key, k.value))
            .collect();
        let entries = state
            .scan::<Keyed<Option<String>>>("b.")
            .await?
            .into_iter()
            .filter_map(|(_, k)| k.value.map(|v| (k.key, v)))
            .collect();
        Ok((machines, entries))
    }

    /// Keeps a machine.
    pub async fn save_machine(&self, address: &str, m: &MachineRecord) -> Result<(), BusError> {
        match &self.buckets {
            Some((state, _)) => {
                state
                    .put(
                        &machine_key(address),
                        &Keyed {
                            key: address.to_owned(),
                            value: m.clone(),
                        },
                    )
                    .await
            }
            None => Ok(()),
        }
    }

    /// Keeps a boot entry (`None`: cleared).
    pub async fn save_entry(&self, mac: &str, cmdline: Option<&str>) -> Result<(), BusError> {
        match &self.buckets {
            Some((state, _)) => {
                state
                    .put(
                        &entry_key(mac),
                        &Keyed {
                            key: mac.to_ascii_lowercase(),
                            value: cmdline.map(str::to_owned),
                        },
                    )
                    .await
            }
            None => Ok(()),
        }
    }

    /// Records that a site command begins: false if it had begun before
    /// (then [`SiteStore::run_of`] says how far it got).
    pub async fn begin_run(&self, command_id: &str) -> Result<bool, BusError> {
        match &self.buckets {
            Some((_, runs)) => {
                runs.create(
                    &format!("x.{}", key_token(command_id)),
                    &CommandRun::Started,
                )
                .await
            }
            None => Ok(true),
        }
    }

    /// Records a site command's result.
    pub async fn finish_run(
        &self,
        command_id: &str,
        result: &CommandResult,
    ) -> Result<(), BusError> {
        match &self.buckets {
            Some((_, runs)) => {
                runs.put(
                    &format!("x.{}", key_token(command_id)),
                    &CommandRun::Done {
                        result: Box::new(result.clone()),
                    },
                )
                .await
            }
            None => Ok(()),
        }
    }

    /// How far a site command got, if it ever began.
    pub async fn run_of(&self, command_id: &str) -> Result<Option<CommandRun>, BusError> {
        match &self.buckets {
            Some((_, runs)) => runs.get(&format!("x.{}", key_token(command_id))).await,
            None => Ok(None),
        }
    }

    /// Notes one execution of `command_id` (a site command, or an agent
    /// command its ramdisk runs) just before it runs, under a key of its
    /// own: the witness the chaos verdicts count, independent of the
    /// records that keep a command from running twice.
    pub async fn note_execution(&self, command_id: &str) -> Result<(), BusError> {
        match &self.buckets {
            Some((_, runs)) => {
                let nonce: u64 = rand::random();
                runs.put(
                    &format!("e.{}.{nonce:016x}", key_token(command_id)),
                    &command_id,
                )
                .await
            }
            None => Ok(()),
        }
    }

    /// Every command id noted as executed more than once, with the count.
    pub async fn repeated_executions(&self) -> Result<Vec<(String, usize)>, BusError> {
        let Some((_, runs)) = &self.buckets else {
            return Ok(vec![]);
        };
        let mut counts: std::collections::HashMap<String, usize> = Default::default();
        for (_, id) in runs.scan::<String>("e.").await? {
            *counts.entry(id).or_default() += 1;
        }
        let mut out: Vec<_> = counts.into_iter().filter(|(_, n)| *n > 1).collect();
        out.sort();
        Ok(out)
    }

    /// How many executions were noted in all.
    pub async fn executions_noted(&self) -> Result<usize, BusError> {
        match &self.buckets {
            Some((_, runs)) => Ok(runs.scan::<String>("e.").await?.len()),
            None => Ok(0),
        }
    }

    /// Records what an agent answered a command with (before posting it).
    pub async fn save_agent_result(&self, result: &AgentResult) -> Result<(), BusError> {
        match &self.buckets {
            Some((_, runs)) => {
                runs.put(&format!("a.{}", key_token(&result.command_id)), result)
                    .await
            }
            None => Ok(()),
        }
    }

    /// What an agent answered a command with, if it ran it.
    pub async fn agent_result(&self, command_id: &str) -> Result<Option<AgentResult>, BusError> {
        match &self.buckets {
            Some((_, runs)) => runs.get(&format!("a.{}", key_token(command_id))).await,
            None => Ok(None),
        }
    }
}

/// A value beside the text its key was made from.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Keyed<T> {
    key: String,
    value: T,
}
