//! What the Redfish driver reads of a system's NICs and drives, and the
//! pure rules that turn those documents into an inventory: which MACs a
//! machine PXE-boots from and which drives it has. The driver fetches; this
//! module decides.
//!
//! NICs follow the standard's two layouts: `Systems/<id>/EthernetInterfaces`
//! (what most BMCs fill), and the adapters' functions,
//! `NetworkInterfaces` → `Links.NetworkAdapter` → `NetworkDeviceFunctions`
//! (`Ethernet.PermanentMACAddress`, else `MACAddress`), where a Dell iDRAC
//! puts its NICs when its `EthernetInterfaces` is empty. Functions that
//! boot (`BootMode` `PXE` or `HTTP`) come first, then the interfaces, then
//! the other Ethernet functions; Fibre Channel and disabled functions never
//! count.

use serde::Deserialize;

use crate::redfish::normalize_mac;

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Link {
    #[serde(rename = "@odata.id")]
    pub id: String,
}

/// `Status` of a resource.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct Status {
    pub state: Option<String>,
}

impl Status {
    /// `Disabled`, `Absent` or `UnavailableOffline`: not usable now.
    fn off(&self) -> bool {
        matches!(
            self.state.as_deref(),
            Some("Disabled" | "Absent" | "UnavailableOffline")
        )
    }
}

/// One `EthernetInterface` of a system.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct EthernetInterface {
    #[serde(rename = "MACAddress")]
    pub mac: Option<String>,
    #[serde(rename = "PermanentMACAddress")]
    pub permanent_mac: Option<String>,
    #[serde(default)]
    pub status: Status,
}

impl EthernetInterface {
    /// Its MAC (the permanent one when it differs), unless it is absent.
    pub fn mac(&self) -> Option<String> {
        if self.status.state.as_deref() == Some("Absent") {
            return None;
        }
        first_mac(&[self.permanent_mac.as_deref(), self.mac.as_deref()])
    }
}

/// One `NetworkInterface` of a system: the link to its adapter.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct NetworkInterface {
    pub links: Option<NetworkInterfaceLinks>,
    /// Deprecated in the standard, still served by some BMCs.
    pub network_device_functions: Option<Link>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct NetworkInterfaceLinks {
    pub network_adapter: Option<Link>,
}

/// A chassis: where its adapters are.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct Chassis {
    pub network_adapters: Option<Link>,
}

/// A `NetworkAdapter`: the link to its functions.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct NetworkAdapter {
    pub network_device_functions: Option<Link>,
}

/// One `NetworkDeviceFunction`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct NetworkDeviceFunction {
    pub net_dev_func_type: Option<String>,
    #[serde(default)]
    pub net_dev_func_capabilities: Option<Vec<String>>,
    pub ethernet: Option<FunctionEthernet>,
    pub boot_mode: Option<String>,
    #[serde(default)]
    pub status: Status,
}

#[derive(Debug, Deserialize)]
pub(crate) struct FunctionEthernet {
    #[serde(rename = "PermanentMACAddress")]
    pub permanent_mac: Option<String>,
    #[serde(rename = "MACAddress")]
    pub mac: Option<String>,
}

/// What one function contributes: its MAC and whether it network-boots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicFunction {
    pub mac: String,
    pub boots: bool,
}

impl NetworkDeviceFunction {
    /// The function as a NIC, if it is an enabled Ethernet function with a
    /// MAC.
    pub fn nic(&self) -> Option<NicFunction> {
        if self.status.off() {
            return None;
        }
        let caps = self.net_dev_func_capabilities.as_deref().unwrap_or(&[]);
        let ethernet = match self.net_dev_func_type.as_deref() {
            Some(t) => t == "Ethernet",
            None => caps.is_empty() || caps.iter().any(|c| c == "Ethernet"),
        };
        if !ethernet || (caps.len() == 1 && caps[0] == "Disabled") {
            return None;
        }
        let e = self.ethernet.as_ref()?;
        let mac = first_mac(&[e.permanent_mac.as_deref(), e.mac.as_deref()])?;
        Some(NicFunction {
            mac,
            boots: matches!(self.boot_mode.as_deref(), Some("PXE" | "HTTP")),
        })
    }
}

fn first_mac(candidates: &[Option<&str>]) -> Option<String> {
    candidates
        .iter()
        .flatten()
        .filter(|m| !m.trim().is_empty())
        .find_map(|m| normalize_mac(m))
        // A BMC's placeholder for "no MAC".
        .filter(|m| m != "00:00:00:00:00:00")
}

/// The MACs a machine PXE-boots from, best first: the functions that boot,
/// then the system's interfaces, then the other Ethernet functions; each
/// MAC once.
pub fn pxe_macs(interfaces: &[String], functions: &[NicFunction]) -> Vec<String> {
    let booting = functions.iter().filter(|f| f.boots).map(|f| &f.mac);
    let rest = functions.iter().filter(|f| !f.boots).map(|f| &f.mac);
    let mut out: Vec<String> = vec![];
    for mac in booting.chain(interfaces).chain(rest) {
        if !out.contains(mac) {
            out.push(mac.clone());
        }
    }
    out
}

/// A `Manager`: where older firmware (iLO 5, Supermicro, DMTF's tower)
/// keeps the virtual media of the systems it manages.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct Manager {
    pub virtual_media: Option<Link>,
    pub firmware_version: Option<String>,
}

/// An action's target.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ActionTarget {
    pub target: String,
}

/// A `VirtualMedia` slot's actions, when it has them (Lenovo XCC and DMTF's
/// mockups have none: their slots are PATCHed).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct MediaActions {
    #[serde(rename = "#VirtualMedia.InsertMedia")]
    pub insert: Option<ActionTarget>,
    #[serde(rename = "#VirtualMedia.EjectMedia")]
    pub eject: Option<ActionTarget>,
}

/// One `VirtualMedia` slot.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct VirtualMedia {
    #[serde(rename = "@odata.id")]
    pub odata_id: String,
    #[serde(rename = "@odata.etag")]
    pub etag: Option<String>,
    #[serde(default)]
    pub media_types: Vec<String>,
    pub image: Option<String>,
    pub inserted: Option<bool>,
    #[serde(default)]
    pub actions: MediaActions,
}

impl VirtualMedia {
    /// Takes a CD or DVD image.
    pub fn takes_cd(&self) -> bool {
        self.media_types.iter().any(|t| t == "CD" || t == "DVD")
    }

    /// Holds `image`, inserted.
    pub fn holds(&self, image: &str) -> bool {
        self.inserted == Some(true) && self.image.as_deref() == Some(image)
    }

    /// Holds nothing (iLO says `""` for no image, others `null`).
    pub fn is_empty(&self) -> bool {
        self.inserted != Some(true) && self.image.as_deref().is_none_or(str::is_empty)
    }
}

/// Which slot a CD image goes into (its index): the first CD/DVD slot
/// with an `InsertMedia` action, else the first CD/DVD slot (PATCHed).
pub(crate) fn cd_slot(slots: &[VirtualMedia]) -> Option<usize> {
    let cd = || slots.iter().enumerate().filter(|(_, s)| s.takes_cd());
    cd().find(|(_, s)| s.actions.insert.is_some())
        .or_else(|| cd().next())
        .map(|(i, _)| i)
}

/// A system's `Storage` resource: its drives.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct Storage {
    #[serde(default)]
    pub drives: Vec<Link>,
}

/// One `Drive`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct Drive {
    pub id: Option<String>,
    pub capacity_bytes: Option<u64>,
    pub media_type: Option<String>,
    pub protocol: Option<String>,
    pub serial_number: Option<String>,
    #[serde(default)]
    pub status: Status,
    #[serde(default)]
    pub actions: DriveActions,
}

/// A `Drive`'s actions: the erase a BMC offers, when it offers one.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct DriveActions {
    #[serde(rename = "#Drive.SecureErase")]
    pub secure_erase: Option<ActionTarget>,
}

/// A `Task` a BMC answers a long action with (`TaskState` until it ends).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct Task {
    #[serde(rename = "@odata.id")]
    pub odata_id: Option<String>,
    pub task_state: Option<String>,
    #[serde(default)]
    pub messages: Vec<serde_json::Value>,
}

impl Task {
    /// `Completed`, `Exception`, `Killed`, `Cancelled`: it ended.
    pub fn ended(&self) -> bool {
        matches!(
            self.task_state.as_deref(),
            Some("Completed" | "Exception" | "Killed" | "Cancelled" | "Interrupted")
        )
    }

    pub fn completed(&self) -> bool {
        self.task_state.as_deref() == Some("Completed")
    }
}

impl Drive {
    /// The drive as the inventory reports it, unless it is absent. Its id
    /// is its `Id`, else the last segment of `path` (iLO links end in `/`).
    pub fn summary(&self, path: &str) -> Option<bcm_contracts::outputs::OobDrive> {
        if self.status.state.as_deref() == Some("Absent") {
            return None;
        }
        let from_path = path
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or(path);
        Some(bcm_contracts::outputs::OobDrive {
            id: self
                .id
                .clone()
                .filter(|id| !id.is_empty())
                .unwrap_or_else(|| from_path.to_owned()),
            capacity_bytes: self.capacity_bytes,
            media_type: self.media_type.clone(),
            protocol: self.protocol.clone(),
            serial: self.serial_number.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn function(v: serde_json::Value) -> Option<NicFunction> {
        serde_json::from_value::<NetworkDeviceFunction>(v)
            .expect("reads")
            .nic()
    }

    #[test]
    fn ethernet_functions_give_their_permanent_mac_and_whether_they_boot() {
        assert_eq!(
            function(json!({"NetDevFuncType": "Ethernet", "BootMode": "PXE",
                "Ethernet": {"PermanentMACAddress": "B0:26:28:00:11:22", "MACAddress": "02:00:00:00:00:01"}})),
            Some(NicFunction {
                mac: "b0:26:28:00:11:22".into(),
                boots: true
            })
        );
        assert_eq!(
            function(
                json!({"NetDevFuncCapabilities": ["Ethernet", "iSCSI"], "BootMode": "Disabled",
                "Ethernet": {"MACAddress": "b0-26-28-00-11-23"}})
            ),
            Some(NicFunction {
                mac: "b0:26:28:00:11:23".into(),
                boots: false
            })
        );
        // Fibre Channel, disabled, MAC-less and placeholder functions do
        // not count.
        for v in [
            json!({"NetDevFuncType": "FibreChannel", "Ethernet": {"MACAddress": "b0:26:28:00:11:24"}}),
            json!({"NetDevFuncType": "Ethernet", "Status": {"State": "Disabled"}, "Ethernet": {"MACAddress": "b0:26:28:00:11:25"}}),
            json!({"NetDevFuncCapabilities": ["Disabled"], "Ethernet": {"MACAddress": "b0:26:28:00:11:26"}}),
            json!({"NetDevFuncType": "Ethernet"}),
            json!({"NetDevFuncType": "Ethernet", "Ethernet": {"MACAddress": "00:00:00:00:00:00"}}),
            json!({"NetDevFuncType": "Ethernet", "Ethernet": {"MACAddress": "not a mac"}}),
        ] {
            assert_eq!(function(v.clone()), None, "{v}");
        }
    }

    #[test]
    fn booting_functions_come_first_and_each_mac_once() {
        let f = |mac: &str, boots| NicFunction {
            mac: mac.into(),
            boots,
        };
        let macs = pxe_macs(
            &["aa:00:00:00:00:02".into(), "aa:00:00:00:00:01".into()],
            &[f("aa:00:00:00:00:03", false), f("aa:00:00:00:00:01", true)],
        );
        assert_eq!(
            macs,
            [
                "aa:00:00:00:00:01",
                "aa:00:00:00:00:02",
                "aa:00:00:00:00:03"
            ]
        );
        assert!(pxe_macs(&[], &[]).is_empty());
    }

    #[test]
    fn absent_interfaces_and_drives_are_left_out() {
        let nic: EthernetInterface = serde_json::from_value(
            json!({"MACAddress": "aa:00:00:00:00:09", "Status": {"State": "Absent"}}),
        )
        .expect("reads");
        assert_eq!(nic.mac(), None);
        let drive: Drive =
            serde_json::from_value(json!({"CapacityBytes": 1, "Status": {"State": "Absent"}}))
                .expect("reads");
        assert!(drive.summary("d").is_none());
        let drive: Drive = serde_json::from_value(
            json!({"CapacityBytes": 480103981056u64, "MediaType": "SSD", "Protocol": "SATA"}),
        )
        .expect("reads");
        assert_eq!(
            drive.summary("d").and_then(|d| d.capacity_bytes),
            Some(480103981056)
        );
    }

    #[test]
    fn a_drive_is_named_by_its_id_else_its_path_without_the_trailing_slash() {
        let with_id: Drive =
            serde_json::from_value(json!({"Id": "Disk.Bay.0", "CapacityBytes": 1})).expect("reads");
        assert_eq!(
            with_id
                .summary("/redfish/v1/Systems/1/Storage/X/Drives/ignored")
                .map(|d| d.id),
            Some("Disk.Bay.0".to_owned())
        );
        let without: Drive = serde_json::from_value(json!({"CapacityBytes": 1})).expect("reads");
        assert_eq!(
            without
                .summary("/redfish/v1/Systems/1/Storage/DA000000/Drives/DA000000/")
                .map(|d| d.id),
            Some("DA000000".to_owned())
        );
    }

    fn slot(v: serde_json::Value) -> VirtualMedia {
        serde_json::from_value(v).expect("reads")
    }

    #[test]
    fn a_cd_image_goes_into_the_first_cd_slot_with_an_insert_action_else_the_first_cd_slot() {
        let usb = slot(json!({"@odata.id": "/u", "MediaTypes": ["USBStick"],
            "Actions": {"#VirtualMedia.InsertMedia": {"target": "/u/i"}}}));
        let patched = slot(json!({"@odata.id": "/p", "MediaTypes": ["CD", "DVD"]}));
        let acted = slot(json!({"@odata.id": "/a", "MediaTypes": ["DVD"],
            "Actions": {"#VirtualMedia.InsertMedia": {"target": "/a/i"}}}));
        let slots = [usb, patched, acted];
        let id = |i: usize| slots[i].odata_id.as_str();
        assert_eq!(cd_slot(&slots).map(id), Some("/a"));
        assert_eq!(cd_slot(&slots[..2]).map(id), Some("/p"));
        assert!(cd_slot(&slots[..1]).is_none());
    }

    #[test]
    fn a_slot_is_empty_without_an_image_whether_null_or_empty() {
        assert!(slot(json!({"@odata.id": "/s", "Image": "", "Inserted": false})).is_empty());
        assert!(slot(json!({"@odata.id": "/s", "Image": null})).is_empty());
        let full = slot(json!({"@odata.id": "/s", "Image": "http://x/a.iso", "Inserted": true}));
        assert!(!full.is_empty() && full.holds("http://x/a.iso") && !full.holds("http://x/b.iso"));
    }
}
