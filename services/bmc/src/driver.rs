//! The operations every BMC driver offers, and the drivers this service
//! hosts: Redfish natively, others as plugins (`plugins.<driver>` in the
//! configuration; IPMI is `bcx-ipmi`). A driver it does not host answers
//! `unsupported-driver`.

use bcm_core::{BmcDriver, BmcTls, PowerAction, PowerState};
use secrecy::SecretString;

use crate::error::BmcError;
use crate::plugin::{PluginDriver, PluginSettings};
pub use crate::redfish::MediaState;
use crate::redfish::{Redfish, RedfishSettings};

pub use bcm_contracts::commands::{BootDevice, BootMode};
pub use bcm_contracts::outputs::{BootOverride, OobInventory as Inventory, Verified};

/// Settings of every hosted driver.
#[derive(Debug, Clone, Default)]
pub struct DriverSettings {
    pub redfish: RedfishSettings,
    /// The drivers hosted as plugins, by driver.
    pub plugins: std::collections::BTreeMap<BmcDriver, PluginSettings>,
}

/// A connected driver for one BMC.
#[derive(Debug)]
pub enum Driver {
    Redfish(Box<Redfish>),
    Plugin(PluginDriver),
}

impl Driver {
    /// A driver for `driver` at `address` with the opened credentials.
    pub fn open(
        driver: BmcDriver,
        address: &str,
        username: SecretString,
        password: SecretString,
        settings: &DriverSettings,
        tls: Option<&BmcTls>,
    ) -> Result<Self, BmcError> {
        match driver {
            BmcDriver::Redfish => Ok(Driver::Redfish(Box::new(Redfish::new(
                address,
                username,
                password,
                settings.redfish.clone(),
                tls,
            )?))),
            BmcDriver::Ipmi | BmcDriver::Plugin(_) => match settings.plugins.get(&driver) {
                Some(plugin) => Ok(Driver::Plugin(PluginDriver::new(
                    driver,
                    address,
                    username,
                    password,
                    plugin.clone(),
                ))),
                None => Err(BmcError::Unsupported(format!(
                    "unsupported-driver: {driver} (this site's bmc service hosts no {driver} plugin: plugins.{})",
                    driver.plugin_name().unwrap_or_default()
                ))),
            },
            BmcDriver::Sim => Err(BmcError::Unsupported(
                "unsupported-driver: sim (the simulated site serves it)".into(),
            )),
            BmcDriver::None => Err(BmcError::Unsupported(
                "unsupported-driver: none (an adopted machine has no BMC)".into(),
            )),
        }
    }

    pub async fn verify(&self) -> Result<Verified, BmcError> {
        match self {
            Driver::Redfish(r) => r.verify().await,
            Driver::Plugin(i) => i.verify().await,
        }
    }

    pub async fn inspect(&self) -> Result<Inventory, BmcError> {
        match self {
            Driver::Redfish(r) => r.inspect().await,
            Driver::Plugin(i) => i.inspect().await,
        }
    }

    pub async fn power_state(&self) -> Result<PowerState, BmcError> {
        match self {
            Driver::Redfish(r) => r.power_state().await,
            Driver::Plugin(i) => i.power_state().await,
        }
    }

    pub async fn power(&self, action: PowerAction) -> Result<PowerState, BmcError> {
        match self {
            Driver::Redfish(r) => r.power(action).await,
            Driver::Plugin(i) => i.power(action).await,
        }
    }

    pub async fn boot(
        &self,
        device: BootDevice,
        persistent: bool,
        mode: Option<BootMode>,
    ) -> Result<BootOverride, BmcError> {
        match self {
            Driver::Redfish(r) => r.boot(device, persistent, mode).await,
            Driver::Plugin(i) => i.boot(device, persistent, mode).await,
        }
    }

    /// Sets a new password on the account the driver logs in with.
    pub async fn set_password(&self, new: &SecretString) -> Result<(), BmcError> {
        match self {
            Driver::Redfish(r) => r.set_password(new).await,
            Driver::Plugin(i) => i.set_password(new).await,
        }
    }

    /// Inserts `image` (an http(s) URL the BMC fetches) as virtual CD/DVD
    /// media and reads it back. Redfish only: the plugin protocol has no
    /// virtual media operation, so a plugin driver answers `unsupported`.
    pub async fn insert_media(&self, image: &str) -> Result<MediaState, BmcError> {
        match self {
            Driver::Redfish(r) => r.insert_media(image).await,
            Driver::Plugin(p) => Err(no_media(p)),
        }
    }

    /// Ejects the virtual CD/DVD media and reads the slot back empty.
    pub async fn eject_media(&self) -> Result<MediaState, BmcError> {
        match self {
            Driver::Redfish(r) => r.eject_media().await,
            Driver::Plugin(p) => Err(no_media(p)),
        }
    }

    /// Erases every drive through the BMC where it offers an erase
    /// (Redfish `#Drive.SecureErase`). A plugin driver offers none: it
    /// says so (`offered: false`) and sends nothing.
    pub async fn erase_drives(&self) -> Result<bcm_contracts::outputs::DiskEraseReport, BmcError> {
        match self {
            Driver::Redfish(r) => r.erase_drives().await,
            Driver::Plugin(p) => Ok(bcm_contracts::outputs::DiskEraseReport {
                offered: false,
                drives: vec![],
                reason: Some(format!(
                    "{} offers no drive erase (the plugin protocol has no such operation)",
                    p.driver()
                )),
                sim: false,
            }),
        }
    }

    /// Releases what the driver holds (a Redfish session).
    pub async fn close(&self) {
        if let Driver::Redfish(r) = self {
            r.logout().await;
        }
    }
}

fn no_media(p: &PluginDriver) -> BmcError {
    BmcError::Unsupported(format!(
        "{} offers no virtual media (the plugin protocol has no such operation)",
        p.driver()
    ))
}
