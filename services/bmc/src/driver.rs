//! The operations every BMC driver offers, and the drivers this service
//! hosts (native Redfish; IPMI through `ipmitool`). A driver it does not
//! host answers `unsupported-driver`.

use bcm_core::{BmcDriver, BmcTls, PowerAction, PowerState};
use secrecy::SecretString;

use crate::error::BmcError;
use crate::ipmi::{Ipmi, IpmiSettings};
use crate::redfish::{Redfish, RedfishSettings};

pub use bcm_contracts::commands::{BootDevice, BootMode};
pub use bcm_contracts::outputs::{BootOverride, OobInventory as Inventory, Verified};

/// Settings of every hosted driver.
#[derive(Debug, Clone, Default)]
pub struct DriverSettings {
    pub redfish: RedfishSettings,
    pub ipmi: IpmiSettings,
}

/// A connected driver for one BMC.
#[derive(Debug)]
pub enum Driver {
    Redfish(Box<Redfish>),
    Ipmi(Ipmi),
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
            BmcDriver::Ipmi => Ok(Driver::Ipmi(Ipmi::new(
                address,
                username,
                password,
                settings.ipmi.clone(),
            )?)),
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
            Driver::Ipmi(i) => i.verify().await,
        }
    }

    pub async fn inspect(&self) -> Result<Inventory, BmcError> {
        match self {
            Driver::Redfish(r) => r.inspect().await,
            Driver::Ipmi(i) => i.inspect().await,
        }
    }

    pub async fn power_state(&self) -> Result<PowerState, BmcError> {
        match self {
            Driver::Redfish(r) => r.power_state().await,
            Driver::Ipmi(i) => i.power_state().await,
        }
    }

    pub async fn power(&self, action: PowerAction) -> Result<PowerState, BmcError> {
        match self {
            Driver::Redfish(r) => r.power(action).await,
            Driver::Ipmi(i) => i.power(action).await,
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
            Driver::Ipmi(i) => i.boot(device, persistent, mode).await,
        }
    }

    /// Sets a new password on the account the driver logs in with.
    pub async fn set_password(&self, new: &SecretString) -> Result<(), BmcError> {
        match self {
            Driver::Redfish(r) => r.set_password(new).await,
            Driver::Ipmi(i) => i.set_password(new).await,
        }
    }

    /// Releases what the driver holds (a Redfish session).
    pub async fn close(&self) {
        if let Driver::Redfish(r) = self {
            r.logout().await;
        }
    }
}
