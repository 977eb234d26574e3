//! `fastblock-nbd map`: serve one export to the kernel's nbd driver through a socket pair,
//! so the image appears as `/dev/nbdX`, until the device is disconnected (`unmap`) or the
//! process is told to stop (then it disconnects the device itself).

use crate::backend::{Export, ExportError, Exports};
use crate::kernel::{self, Attachment, KernelError};
use crate::option_reply::transmission_flags;
use crate::request::Negotiated;
use crate::transmission::{serve, Limits};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::watch;

#[derive(Debug, thiserror::Error)]
pub enum MapError {
    #[error(transparent)]
    Export(#[from] ExportError),
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error("socket pair: {0}")]
    Socket(std::io::Error),
}

/// How often the attached device is checked for a disconnect by someone else.
const DETACH_POLL: Duration = Duration::from_millis(200);

/// Attaches export `name` to `device` (or the first free one), calls `attached` with the
/// device path, and serves it until it is disconnected or `stop` completes.
pub async fn run<E: Exports>(
    exports: &E,
    name: &str,
    device: Option<PathBuf>,
    attached: impl FnOnce(&Path),
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), MapError> {
    let device = match device {
        Some(device) => device,
        None => kernel::free_device()?,
    };
    let export = exports.open(name).await?;
    let size_bytes = export.size_bytes();
    let read_only = export.read_only();
    let (ours, kernels) = std::os::unix::net::UnixStream::pair().map_err(MapError::Socket)?;
    ours.set_nonblocking(true).map_err(MapError::Socket)?;
    let ours = tokio::net::UnixStream::from_std(ours).map_err(MapError::Socket)?;
    // The kernel never negotiates: simple replies, no metadata contexts.
    let negotiated = Negotiated {
        size_bytes,
        structured: false,
        allocation_context: false,
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let server = tokio::spawn(serve(ours, export, negotiated, Limits::default(), stop_rx));
    let attachment = kernel::attach(
        &device,
        size_bytes,
        transmission_flags(false, read_only),
        OwnedFd::from(kernels),
    );
    let attachment = match attachment {
        Ok(a) => a,
        Err(e) => {
            let _ = stop_tx.send(true);
            let _ = server.await;
            return Err(e.into());
        }
    };
    attached(&device);
    wait(&attachment, stop).await;
    let result = tokio::task::spawn_blocking(move || attachment.wait())
        .await
        .unwrap_or_else(|e| {
            Err(KernelError::Io {
                what: "waiting for",
                device: device.clone(),
                source: std::io::Error::other(e.to_string()),
            })
        });
    let _ = stop_tx.send(true);
    if let Ok(Err(e)) = server.await {
        tracing::warn!("serving the kernel: {e}");
    }
    result.map_err(MapError::from)
}

/// Returns when the device was disconnected, or after `stop`, having disconnected it.
async fn wait(attachment: &Attachment, stop: impl std::future::Future<Output = ()>) {
    tokio::pin!(stop);
    loop {
        if attachment.is_finished() {
            return;
        }
        tokio::select! {
            _ = &mut stop => {
                if let Err(e) = kernel::detach(&attachment.device) {
                    tracing::warn!("disconnecting {}: {e}", attachment.device.display());
                }
                return;
            }
            _ = tokio::time::sleep(DETACH_POLL) => {}
        }
    }
}
