//! Headless Chromium for tests of the monitor's status page, driven over the DevTools protocol
//! on a pipe (`--remote-debugging-pipe`: the browser reads commands on its fd 3 and writes
//! answers and events on its fd 4, each a JSON message ended by a NUL byte). A pipe needs no
//! port and no websocket client, and the browser reads the page the way an operator's does:
//! its scripts run, and the test reads what they rendered.
//!
//! Chromium comes from `scripts/install-deps.sh` (Debian's `chromium`). Without it the test
//! fails saying so: a test that cannot run must never pass. `FASTBLOCK_TEST_CHROMIUM` names
//! another binary. Every call is bounded; the browser runs in its own process group, closed
//! through the protocol and then killed by that group's id (never by name).

use super::TempDir;
use serde_json::{json, Value};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// Longest one DevTools call may take (a page load is not one: `open` returns at once).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Messages the reader thread holds before it waits for the test to take them.
const MESSAGES_QUEUED_MAX: usize = 4096;
/// How long a polite `Browser.close` may take before the process group is killed.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The binary the tests run: `$FASTBLOCK_TEST_CHROMIUM`, else `chromium`.
fn chromium_binary() -> String {
    std::env::var("FASTBLOCK_TEST_CHROMIUM").unwrap_or_else(|_| "chromium".to_string())
}

pub struct Browser {
    child: Option<Child>,
    to_browser: File,
    from_browser: Receiver<Value>,
    next_id: u64,
    /// The DevTools session of the page `open` attached to.
    session: Option<String>,
    log: PathBuf,
    /// The fresh profile (`--user-data-dir`), removed on drop (after the browser is gone).
    _profile: TempDir,
}

/// A pipe whose two ends close on exec (the child gets only the copies made for it).
fn pipe() -> (File, File) {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two new descriptors into the array we own.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just created and are owned by nobody else.
    unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
}

impl Browser {
    /// Starts headless Chromium with a fresh profile, or panics saying it is not installed.
    pub fn launch() -> Browser {
        let binary = chromium_binary();
        let version = Command::new(&binary).arg("--version").output();
        let version = match version {
            Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).to_string(),
            other => panic!(
                "Chromium ({binary:?}) cannot run, so the status page cannot be tested: {other:?}. \
                 Install it with scripts/install-deps.sh (Debian package `chromium`), or name \
                 the binary in FASTBLOCK_TEST_CHROMIUM."
            ),
        };
        eprintln!("status page test: {}", version.trim());
        let profile = TempDir::new("chromium");
        let log = profile.path().join("chromium.log");
        let file = File::create(&log).expect("creating the browser log");
        let (browser_reads, to_browser) = pipe();
        let (from_browser, browser_writes) = pipe();
        let (r, w) = (browser_reads.as_raw_fd(), browser_writes.as_raw_fd());
        let mut cmd = Command::new(&binary);
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--remote-debugging-pipe",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("about:blank")
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("log file"))
        .stderr(file);
        // SAFETY: only async-signal-safe calls between fork and exec. The pipe ends are first
        // copied above fd 10 (so that moving them onto 3 and 4 cannot overwrite one with the
        // other), then onto 3 and 4, which dup2 leaves open across exec; the copies above 10
        // close on exec. A process group of its own lets drop kill the browser's helpers too.
        unsafe {
            cmd.pre_exec(move || {
                let r_high = libc::fcntl(r, libc::F_DUPFD_CLOEXEC, 10);
                let w_high = libc::fcntl(w, libc::F_DUPFD_CLOEXEC, 10);
                if r_high < 0
                    || w_high < 0
                    || libc::dup2(r_high, 3) < 0
                    || libc::dup2(w_high, 4) < 0
                    || libc::setpgid(0, 0) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {binary}: {e}"));
        // The browser's ends now live in the browser only.
        drop((browser_reads, browser_writes));
        let (tx, rx) = sync_channel(MESSAGES_QUEUED_MAX);
        std::thread::spawn(move || {
            let mut reader = BufReader::new(from_browser);
            loop {
                let mut message = Vec::new();
                match reader.read_until(0, &mut message) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                if message.last() == Some(&0) {
                    message.pop();
                }
                let Ok(value) = serde_json::from_slice::<Value>(&message) else {
                    continue;
                };
                if tx.send(value).is_err() {
                    return;
                }
            }
        });
        Browser {
            child: Some(child),
            to_browser,
            from_browser: rx,
            next_id: 1,
            session: None,
            log,
            _profile: profile,
        }
    }

    /// The last lines the browser wrote to stderr (for failure messages).
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Sends one DevTools command and waits (bounded) for its answer, skipping events.
    fn call(&mut self, method: &str, params: Value, session: Option<&str>) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if let Some(s) = session {
            message["sessionId"] = json!(s);
        }
        let mut bytes = serde_json::to_vec(&message).expect("a JSON message");
        bytes.push(0);
        if let Err(e) = self.to_browser.write_all(&bytes) {
            panic!("sending {method} to the browser: {e}\n{}", self.log_tail());
        }
        let deadline = Instant::now() + CALL_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.from_browser.recv_timeout(left) {
                Ok(answer) if answer["id"] == json!(id) => {
                    if let Some(e) = answer.get("error") {
                        panic!("{method} failed: {e}");
                    }
                    return answer["result"].clone();
                }
                Ok(_event) => {}
                Err(RecvTimeoutError::Timeout) => panic!(
                    "the browser did not answer {method} within {CALL_TIMEOUT:?}\n{}",
                    self.log_tail()
                ),
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("the browser exited during {method}\n{}", self.log_tail())
                }
            }
        }
    }

    /// Opens `url` in a new tab and attaches to it; the page loads (and its scripts run) in
    /// the background: callers poll with [`Browser::eval`].
    pub fn open(&mut self, url: &str) {
        let target = self.call("Target.createTarget", json!({ "url": url }), None);
        let target_id = target["targetId"].clone();
        let attached = self.call(
            "Target.attachToTarget",
            json!({ "targetId": target_id, "flatten": true }),
            None,
        );
        let session = attached["sessionId"]
            .as_str()
            .expect("a session id")
            .to_string();
        self.session = Some(session);
    }

    /// Evaluates `expression` in the open page and returns its value (JSON-serialisable).
    pub fn eval(&mut self, expression: &str) -> Value {
        let session = self.session.clone().expect("open a page first");
        let answer = self.call(
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true }),
            Some(&session),
        );
        if let Some(e) = answer.get("exceptionDetails") {
            panic!("evaluating {expression:?} threw: {e}");
        }
        answer["result"]["value"].clone()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // Politely first, so the browser reaps its own helpers; then the whole group.
        let mut close = serde_json::to_vec(&json!({ "id": 0, "method": "Browser.close" }))
            .expect("a JSON message");
        close.push(0);
        let _ = self.to_browser.write_all(&close);
        let deadline = Instant::now() + CLOSE_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // SAFETY: kill(2) of the process group our child leads (its id is the child's PID, set
        // by setpgid before exec). The leader is not reaped yet, so the id is still ours.
        unsafe {
            libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL);
        }
        let _ = child.wait();
    }
}
