//! Bench workers: one per core of `-m` (one in all without it). A worker owns an open image
//! and runs its share of each phase it is sent ([`crate::workload::run_share`]).
//!
//! Why a thread, a runtime and a client per worker: the client's connections live in the
//! runtime that opened them, so a worker whose IO should stay on its core needs its own
//! runtime there, and that runtime its own connections, like the reference's one SPDK thread
//! per core. The runtime keeps `--threads` worker threads (1 by default), all pinned to the
//! worker's core with the thread that drives it.
//!
//! [`Worker::local`] runs a worker as a task of the caller's runtime on an image the caller
//! opened: the library tests drive fake OSDs that way.

use crate::workload::{run_share, PhaseJob};
use anyhow::{anyhow, Context, Result};
use fastblock_client::types::map::ImageInfo;
use fastblock_client::{ClientConfig, ClientStats, Cluster, Image};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// Phases queued to one worker: they run one at a time, and the caller waits for each.
const PHASE_QUEUE_LEN: usize = 1;

/// What a worker answers when its share of a phase is done.
#[derive(Clone, Copy, Debug)]
pub struct ShareDone {
    /// When its last IO completed.
    pub end: Instant,
    /// Its client's counters so far (all phases).
    pub client: ClientStats,
}

type PhaseRequest = (PhaseJob, oneshot::Sender<ShareDone>);

/// A running worker.
pub struct Worker {
    /// The core it was asked to run on (`None` without `-m`).
    pub core: Option<usize>,
    /// Whether its threads are pinned to that core.
    pub pinned: bool,
    phases: mpsc::Sender<PhaseRequest>,
}

/// How to start the workers of the binary.
#[derive(Clone, Debug)]
pub struct WorkerSetup {
    pub client: ClientConfig,
    pub image: ImageInfo,
    /// Worker threads of each worker's runtime.
    pub threads: usize,
}

impl Worker {
    /// A worker as a task of the current runtime, on `image` (unpinned).
    pub fn local(image: Image) -> Worker {
        let (phases, queue) = mpsc::channel(PHASE_QUEUE_LEN);
        tokio::spawn(serve(image, queue));
        Worker {
            core: None,
            pinned: false,
            phases,
        }
    }

    /// Starts a worker on its own thread and runtime, pinned to `core` when `pin` (else
    /// unpinned), with its own client; returns once its image is open.
    pub async fn start(core: Option<usize>, pin: bool, setup: &WorkerSetup) -> Result<Worker> {
        let (phases, queue) = mpsc::channel(PHASE_QUEUE_LEN);
        let (ready_tx, ready_rx) = oneshot::channel::<Result<()>>();
        let setup = setup.clone();
        let name = match core {
            Some(core) => format!("bench-core{core}"),
            None => "bench-worker".to_string(),
        };
        let pin_to = core.filter(|_| pin);
        std::thread::Builder::new()
            .name(name)
            .spawn(move || worker_thread(pin_to, setup, queue, ready_tx))
            .context("starting a worker thread")?;
        let what = match core {
            Some(core) => format!("the worker of core {core}"),
            None => "the worker".to_string(),
        };
        ready_rx
            .await
            .map_err(|_| anyhow!("{what} stopped while starting"))?
            .with_context(|| what.clone())?;
        Ok(Worker {
            core,
            pinned: pin_to.is_some(),
            phases,
        })
    }

    /// Hands this worker its share of a phase; the receiver answers when the share is done.
    pub async fn submit(&self, job: PhaseJob) -> Result<oneshot::Receiver<ShareDone>, String> {
        let (done_tx, done_rx) = oneshot::channel();
        self.phases
            .send((job, done_tx))
            .await
            .map_err(|_| WORKER_GONE.to_string())?;
        Ok(done_rx)
    }
}

/// The error when a worker's thread or task ended while it had work.
pub const WORKER_GONE: &str = "a bench worker stopped unexpectedly";

async fn serve(image: Image, mut queue: mpsc::Receiver<PhaseRequest>) {
    while let Some((job, done)) = queue.recv().await {
        let end = run_share(&image, &job).await;
        let client = image.cluster().stats();
        // The caller may have gone (it stopped waiting): nothing to tell then.
        let _ = done.send(ShareDone { end, client });
    }
}

fn worker_thread(
    pin_to: Option<usize>,
    setup: WorkerSetup,
    queue: mpsc::Receiver<PhaseRequest>,
    ready: oneshot::Sender<Result<()>>,
) {
    let pin = move || {
        if let Some(core) = pin_to {
            // The caller checked that this process may run on `core`; a refusal now (the
            // affinity changed under us) leaves this thread unpinned rather than stopping.
            if let Err(e) = crate::cores::pin_current_thread(core) {
                eprintln!("warning: pinning a thread to core {core}: {e}");
            }
        }
    };
    pin();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(setup.threads)
        .on_thread_start(pin)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            let _ = ready.send(Err(anyhow!("starting its runtime: {e}")));
            return;
        }
    };
    runtime.block_on(async move {
        let opened = async {
            let cluster = Cluster::connect(setup.client.clone())
                .await
                .with_context(|| {
                    format!("connecting to monitors {}", setup.client.monitors.join(","))
                })?;
            let info = &setup.image;
            cluster
                .open_image_info(info.clone())
                .await
                .with_context(|| format!("opening image {}/{}", info.pool_name, info.name))
        };
        match opened.await {
            Ok(image) => {
                if ready.send(Ok(())).is_ok() {
                    serve(image, queue).await;
                }
            }
            Err(e) => {
                let _ = ready.send(Err(e));
            }
        }
    });
}
