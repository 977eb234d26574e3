//! Config calls relayed by the monitor (`fastblock-client config ... osd.N` from a host without
//! this OSD's admin socket): they come in heartbeat answers and their replies go out in the
//! next heartbeat (docs/mon-api.md, `POST /v1/osds/{id}/config`). The daemon answers them with
//! the same handler as its admin socket, passed in as a [`ConfigHandler`] since this library
//! cannot see the binary's settings.

use fastblock_types::api::{OsdConfigCall, OsdConfigReply};
use fastblock_types::daemon_config::{AdminReply, AdminRequest};
use std::sync::Arc;

/// Answers one config request (the binary's `RuntimeConfig::handle`).
#[derive(Clone)]
pub struct ConfigHandler(Arc<dyn Fn(AdminRequest) -> AdminReply + Send + Sync>);

impl ConfigHandler {
    pub fn new(f: impl Fn(AdminRequest) -> AdminReply + Send + Sync + 'static) -> Self {
        ConfigHandler(Arc::new(f))
    }
}

impl std::fmt::Debug for ConfigHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConfigHandler")
    }
}

/// The replies to `calls`, in order; without a handler each is refused with the reason.
pub fn answer(handler: Option<&ConfigHandler>, calls: Vec<OsdConfigCall>) -> Vec<OsdConfigReply> {
    calls
        .into_iter()
        .map(|call| {
            tracing::info!(id = call.id, request = ?call.request, "config call from the monitor");
            let reply = match handler {
                Some(h) => (h.0)(call.request),
                None => AdminReply::refused("this OSD was started without runtime settings"),
            };
            OsdConfigReply { id: call.id, reply }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_call_is_answered_by_the_handler_under_its_id() {
        let handler = ConfigHandler::new(|req| AdminReply::refused(format!("{req:?}")));
        let calls = vec![
            OsdConfigCall {
                id: 7,
                request: AdminRequest::Show,
            },
            OsdConfigCall {
                id: 9,
                request: AdminRequest::Get {
                    key: "log_level".into(),
                },
            },
        ];
        let replies = answer(Some(&handler), calls.clone());
        assert_eq!(replies.iter().map(|r| r.id).collect::<Vec<_>>(), [7, 9]);
        assert_eq!(
            replies[1].reply.error.as_deref(),
            Some("Get { key: \"log_level\" }")
        );
        let refused = answer(None, calls);
        assert!(refused[0]
            .reply
            .error
            .as_ref()
            .unwrap()
            .contains("without runtime settings"));
    }
}
