//! A daemon's admin socket, `<run-dir>/<entity>.asok`: `fastblock-client config` reads its
//! settings and changes the runtime-settable ones (protocol and the reasons for a local Unix
//! socket: `fastblock_cli::daemon_config`).
//!
//! Who may connect: the socket is made mode 0600 and each connection's peer uid must be the
//! daemon's own or root, so another local user can neither read nor change the settings.

use crate::config::{Setting, Source};
use fastblock_cli::daemon_config::{AdminReply, AdminRequest, SettingView, ADMIN_LINE_BYTES_MAX};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

/// Changes one setting in the running daemon; returns the value as now in force.
pub type Setter = Box<dyn Fn(&str) -> Result<String, String> + Send + Sync>;

/// How long a connection may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The daemon's settings as loaded, and the setters of those that can change at runtime.
pub struct RuntimeConfig {
    settings: Mutex<Vec<Setting>>,
    setters: BTreeMap<String, Setter>,
}

impl RuntimeConfig {
    pub fn new(settings: Vec<Setting>) -> RuntimeConfig {
        RuntimeConfig {
            settings: Mutex::new(settings),
            setters: BTreeMap::new(),
        }
    }

    /// Makes `key` settable at runtime. `key` must be one of the settings.
    pub fn settable(mut self, key: &str, setter: Setter) -> RuntimeConfig {
        assert!(
            self.lock().iter().any(|s| s.key == key),
            "runtime setting {key} is not a flag"
        );
        self.setters.insert(key.to_string(), setter);
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Setting>> {
        // A setter never panics while holding it; a poisoned lock still holds valid settings.
        self.settings.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn view(&self, s: &Setting) -> SettingView {
        SettingView {
            key: s.key.clone(),
            value: s.value.clone(),
            source: s.source.as_str().to_string(),
            settable: self.setters.contains_key(&s.key),
        }
    }

    fn settable_list(&self) -> String {
        self.setters.keys().cloned().collect::<Vec<_>>().join(", ")
    }

    /// Answers one request.
    pub fn handle(&self, request: AdminRequest) -> AdminReply {
        let refuse = |why: String| AdminReply {
            settings: Vec::new(),
            error: Some(why),
        };
        match request {
            AdminRequest::Show => AdminReply {
                settings: self.lock().iter().map(|s| self.view(s)).collect(),
                error: None,
            },
            AdminRequest::Get { key } => match self.lock().iter().find(|s| s.key == key) {
                Some(s) => AdminReply {
                    settings: vec![self.view(s)],
                    error: None,
                },
                None => refuse(format!("unknown setting {key:?}")),
            },
            AdminRequest::Set { key, value } => {
                let Some(setter) = self.setters.get(&key) else {
                    let what = if self.lock().iter().any(|s| s.key == key) {
                        "cannot be changed at runtime"
                    } else {
                        "is not a setting"
                    };
                    return refuse(format!(
                        "{key:?} {what}; the settable ones are: {}",
                        self.settable_list()
                    ));
                };
                // Under the lock, so that two changes of one setting land in the order shown.
                let mut settings = self.lock();
                match setter(&value) {
                    Ok(now) => {
                        let setting = settings
                            .iter_mut()
                            .find(|s| s.key == key)
                            .expect("settable keys are settings (RuntimeConfig::settable)");
                        setting.value = now;
                        setting.source = Source::Runtime;
                        tracing::info!(key = %key, value = %setting.value, "setting changed at runtime");
                        AdminReply {
                            settings: vec![self.view(setting)],
                            error: None,
                        }
                    }
                    Err(why) => refuse(format!("{key}: {why}")),
                }
            }
        }
    }
}

/// Binds the admin socket and serves it on a task. A socket file left by a daemon that is gone
/// is replaced; one that answers belongs to a running daemon and is an error.
pub async fn serve(path: PathBuf, config: Arc<RuntimeConfig>) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    if path.exists() {
        if UnixStream::connect(&path).await.is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!("{} is the admin socket of a running daemon", path.display()),
            ));
        }
        use std::os::unix::fs::FileTypeExt;
        if !std::fs::symlink_metadata(&path)?.file_type().is_socket() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ));
        }
        std::fs::remove_file(&path)?;
    }
    let listener = UnixListener::bind(&path)?;
    set_owner_only(&path)?;
    tracing::info!(socket = %path.display(), "admin socket ready");
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let config = config.clone();
                    tokio::spawn(async move {
                        if let Err(e) = on_connection(stream, &config).await {
                            tracing::warn!("admin socket: {e}");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!("admin socket: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
    Ok(())
}

/// [`serve`] for a daemon's start: an admin socket that cannot be made is reported and the
/// daemon runs without it (it is for changing settings, not for serving data).
pub async fn serve_or_warn(run_dir: &Path, entity: &str, config: Arc<RuntimeConfig>) {
    let path = crate::config::admin_socket_path(run_dir, entity);
    if let Err(e) = serve(path.clone(), config).await {
        tracing::warn!(
            "no admin socket ({}: {e}): `fastblock-client config` cannot reach this daemon",
            path.display()
        );
    }
}

fn set_owner_only(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

async fn on_connection(stream: UnixStream, config: &RuntimeConfig) -> std::io::Result<()> {
    let peer = stream.peer_cred()?.uid();
    // SAFETY: geteuid has no preconditions and cannot fail.
    let own = unsafe { libc::geteuid() };
    let (read, mut write) = stream.into_split();
    let reply = if peer != own && peer != 0 {
        AdminReply {
            settings: Vec::new(),
            error: Some(format!("uid {peer} may not use this admin socket")),
        }
    } else {
        let mut line = String::new();
        let mut reader = BufReader::new(read).take(ADMIN_LINE_BYTES_MAX);
        let read = reader.read_line(&mut line);
        match tokio::time::timeout(REQUEST_TIMEOUT, read).await {
            Ok(result) => {
                result?;
            }
            Err(_) => return Ok(()),
        }
        match serde_json::from_str::<AdminRequest>(&line) {
            Ok(request) => config.handle(request),
            Err(e) => AdminReply {
                settings: Vec::new(),
                error: Some(format!("not a request: {e}")),
            },
        }
    };
    let mut bytes = serde_json::to_vec(&reply).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    write.write_all(&bytes).await
}
