//! Why a BMC operation failed, classified once: whether a retry may help
//! (the result's `retryable`) and the text that becomes the node's
//! `lastError`. No variant ever carries a credential.

/// An error of a BMC operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BmcError {
    /// The BMC refused the credentials.
    #[error("{driver} BMC at {address}: authentication failed: {message}")]
    Unauthorized {
        driver: bcm_core::BmcDriver,
        address: String,
        message: String,
    },
    /// The BMC did not answer (connection refused, reset, DNS, TLS).
    #[error("{driver} BMC at {address} is unreachable: {message}")]
    Unreachable {
        driver: bcm_core::BmcDriver,
        address: String,
        message: String,
    },
    /// The BMC answered with an error status. `message` names the
    /// request and the status (`GET /redfish/v1/Systems: 404 Not Found`)
    /// and carries the BMC's `@Message.ExtendedInfo` text when it gave one.
    #[error("{driver} BMC at {address}: {message}")]
    Refused {
        driver: bcm_core::BmcDriver,
        address: String,
        status: u16,
        message: String,
    },
    /// The BMC accepted the request but the machine did not reach the state
    /// in time.
    #[error("{driver} BMC at {address}: {message}")]
    Timeout {
        driver: bcm_core::BmcDriver,
        address: String,
        message: String,
    },
    /// The BMC or this service cannot do what was asked.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The command or the BMC's answer is malformed.
    #[error("{0}")]
    Invalid(String),
    /// A password rotation did not take and the current password still
    /// logs in: the rotation is rolled back.
    #[error("password rotation rolled back: {0}")]
    RotationRolledBack(String),
}

impl BmcError {
    /// Whether the same command may succeed if sent again.
    pub fn retryable(&self) -> bool {
        match self {
            BmcError::Unreachable { .. } | BmcError::Timeout { .. } => true,
            BmcError::Refused { status, .. } => *status >= 500 || matches!(status, 409 | 412),
            BmcError::Unauthorized { .. }
            | BmcError::Unsupported(_)
            | BmcError::Invalid(_)
            | BmcError::RotationRolledBack(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_answers_are_retryable_and_refusals_are_not() {
        let refused = |status| BmcError::Refused {
            driver: bcm_core::BmcDriver::Redfish,
            address: "x".into(),
            status,
            message: String::new(),
        };
        assert!(refused(503).retryable());
        assert!(refused(409).retryable());
        assert!(refused(412).retryable());
        assert!(!refused(400).retryable());
        assert!(!refused(404).retryable());
        assert!(!BmcError::Unauthorized {
            driver: bcm_core::BmcDriver::Ipmi,
            address: "x".into(),
            message: String::new()
        }
        .retryable());
        assert!(BmcError::Unreachable {
            driver: bcm_core::BmcDriver::Ipmi,
            address: "x".into(),
            message: String::new()
        }
        .retryable());
    }
}
