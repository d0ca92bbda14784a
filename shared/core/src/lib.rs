//! Domain types and rules of Better Compute Metal, with no I/O.
//!
//! This crate owns the one provision state table ([`table`]), the typed ids
//! ([`ids`]), the error codes every edge maps to ([`error`]) and the
//! authorization decisions ([`authz`]). Everything that asks "is this move
//! legal" reads [`table::apply`]; no other crate decides it.

pub mod agentless;
pub mod authz;
pub mod batch;
pub mod bmc;
pub mod dedicated;
pub mod deploy;
pub mod erase;
pub mod error;
pub mod hardware;
pub mod ids;
pub mod node;
pub mod reconcile;
pub mod rescue;
pub mod state;
pub mod table;
pub mod text;
pub mod wire;
pub mod workflow;

pub use bmc::BmcTls;
pub use error::ErrorCode;
pub use ids::{CommandId, IdError, NodeId, PoolId, SiteId, TenantId, WorkflowId};
pub use node::{BmcDriver, PluginName, PowerAction, PowerState, WipeMode};
pub use state::ProvisionState;
pub use table::{apply, Move, MoveError, NodeFacts, Transition, Verb};
