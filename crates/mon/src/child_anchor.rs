//! Starts child processes from one thread that lives as long as the monitor.
//!
//! The own etcd member is started with `PR_SET_PDEATHSIG` so that it dies with a SIGKILLed
//! monitor. Linux sends that signal when the *thread* that forked the child exits, not the
//! process: a child forked from a tokio worker that later retires (a worker that ran
//! `block_in_place` becomes a blocking-pool thread, and those exit after 10 s idle) is killed
//! with the monitor still running. So every such child is forked here, on a thread started
//! once and never ended: it exits only with the process.

use std::sync::mpsc;
use std::sync::OnceLock;
use tokio::process::{Child, Command};

type Job = Box<dyn FnOnce() + Send>;

/// The anchor thread's queue. A `Sender` in a static is never dropped, so the thread's
/// `recv` never fails and the thread never ends.
static ANCHOR: OnceLock<mpsc::Sender<Job>> = OnceLock::new();

fn anchor() -> &'static mpsc::Sender<Job> {
    ANCHOR.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("child-anchor".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job();
                }
            })
            .expect("starting the child-anchor thread");
        tx
    })
}

/// Makes the child of `cmd` receive SIGKILL when the thread that forks it ends
/// (`PR_SET_PDEATHSIG`): fork it with [`spawn`], and that is when the monitor ends.
pub fn dies_with_its_forking_thread(cmd: &mut Command) {
    // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no Rust state; it runs
    // in the forked child before exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Spawns `cmd` from the anchor thread, registered with the caller's tokio runtime (its
/// `wait` and `kill` work as for any `tokio::process` child).
pub async fn spawn(mut cmd: Command) -> std::io::Result<Child> {
    let runtime = tokio::runtime::Handle::current();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let _entered = runtime.enter();
        // The caller may have stopped waiting; the child is then dropped, and killed if the
        // command asked for `kill_on_drop`.
        let _ = tx.send(cmd.spawn());
    });
    anchor()
        .send(job)
        .map_err(|_| std::io::Error::other("the child-anchor thread is gone"))?;
    rx.await
        .map_err(|_| std::io::Error::other("the child-anchor thread dropped a spawn"))?
}

#[cfg(test)]
mod tests {
    use super::{dies_with_its_forking_thread, spawn};
    use std::time::Duration;
    use tokio::process::{Child, Command};

    fn sleeper_dying_with_its_parent_thread() -> Command {
        let mut cmd = Command::new("sleep");
        cmd.arg("30").kill_on_drop(true);
        dies_with_its_forking_thread(&mut cmd);
        cmd
    }

    /// Spawns from a thread that ends right after, as a retired blocking-pool thread does.
    fn from_a_thread_that_exits(anchored: bool) -> Child {
        let runtime = tokio::runtime::Handle::current();
        std::thread::spawn(move || {
            runtime.block_on(async {
                let cmd = sleeper_dying_with_its_parent_thread();
                if anchored {
                    spawn(cmd).await.unwrap()
                } else {
                    let mut cmd = cmd;
                    cmd.spawn().unwrap()
                }
            })
        })
        .join()
        .unwrap()
    }

    async fn exited_within(child: &mut Child, wait: Duration) -> bool {
        tokio::time::timeout(wait, child.wait()).await.is_ok()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_child_outlives_the_thread_that_asked_for_it_only_when_anchored() {
        let mut bare = from_a_thread_that_exits(false);
        assert!(
            exited_within(&mut bare, Duration::from_secs(5)).await,
            "forked by the thread that exited: PR_SET_PDEATHSIG killed it"
        );
        let mut anchored = from_a_thread_that_exits(true);
        assert!(
            !exited_within(&mut anchored, Duration::from_millis(500)).await,
            "forked by the anchor thread: still running"
        );
        anchored.kill().await.unwrap();
    }
}
