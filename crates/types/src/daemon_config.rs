//! A daemon's runtime settings as `fastblock-client config show|get|set` asks for them: the
//! request and reply of its admin socket (`fastblock_cli::daemon_config`), also relayed to an
//! OSD by the monitor in heartbeat answers (`POST /v1/osds/{id}/config`, docs/mon-api.md).
//! Here because the CLI, the monitor, the OSD library and the daemons all speak it.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum AdminRequest {
    Show,
    Get { key: String },
    Set { key: String, value: String },
}

/// One setting: its effective value, where it came from (`default`, `file`, `env`, `flag`,
/// `runtime`) and whether `config set` may change it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettingView {
    pub key: String,
    pub value: String,
    pub source: String,
    pub settable: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdminReply {
    /// `show`: every setting; `get` and `set`: the one named (after the change).
    pub settings: Vec<SettingView>,
    /// Why the request was refused (nothing changed).
    pub error: Option<String>,
}

impl AdminReply {
    /// A refusal: nothing changed, for the reason given.
    pub fn refused(why: impl Into<String>) -> AdminReply {
        AdminReply {
            settings: Vec::new(),
            error: Some(why.into()),
        }
    }
}
