//! rtt_bench: the loopback TCP round trip of a request of `--request-bytes` (4 KiB) answered
//! by `--reply-bytes` (16 B), measured with plain blocking sockets and `TCP_NODELAY` between
//! two threads of this process. It is the network part of the benchmark kit's latency floor
//! (`bench/run.sh`): what one hop of a small write costs on this machine, with no fastblock
//! code in the way.
//!
//! Output: one line of text, or with `--json` an object with `mean_us`, `p50_us`, `p99_us`,
//! `p999_us`, `min_us`, `iterations`.

use anyhow::{Context, Result};
use clap::Parser;
use hdrhistogram::Histogram;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

#[derive(Debug, Parser)]
#[command(
    name = "rtt_bench",
    version = fastblock_version::VERSION,
    about = "Loopback TCP round-trip time between two threads (the benchmark kit's network floor)"
)]
struct Args {
    /// Measured round trips.
    #[arg(long, default_value_t = 20_000)]
    iterations: u64,
    /// Round trips before measuring (connection and caches warm up).
    #[arg(long, default_value_t = 2_000)]
    warmup: u64,
    /// Bytes of each request.
    #[arg(long, default_value_t = 4096)]
    request_bytes: usize,
    /// Bytes of each reply.
    #[arg(long, default_value_t = 16)]
    reply_bytes: usize,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Answers every request of `request_bytes` with `reply_bytes` until the client closes.
fn serve(listener: TcpListener, request_bytes: usize, reply_bytes: usize) -> Result<()> {
    let (mut stream, _) = listener.accept().context("accept")?;
    stream.set_nodelay(true)?;
    let mut request = vec![0u8; request_bytes];
    let reply = vec![0x5au8; reply_bytes];
    loop {
        match stream.read_exact(&mut request) {
            Ok(()) => stream.write_all(&reply)?,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(args) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<()> {
    anyhow::ensure!(args.iterations > 0, "--iterations must be positive");
    anyhow::ensure!(
        args.request_bytes > 0 && args.reply_bytes > 0,
        "sizes must be positive"
    );
    let listener = TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let (request_bytes, reply_bytes) = (args.request_bytes, args.reply_bytes);
    let server = std::thread::spawn(move || serve(listener, request_bytes, reply_bytes));
    let mut stream = TcpStream::connect(addr).context("connecting to the echo thread")?;
    stream.set_nodelay(true)?;
    let request = vec![0xa5u8; args.request_bytes];
    let mut reply = vec![0u8; args.reply_bytes];
    let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut sum = Duration::ZERO;
    for i in 0..args.warmup + args.iterations {
        let start = Instant::now();
        stream.write_all(&request)?;
        stream.read_exact(&mut reply)?;
        let took = start.elapsed();
        if i >= args.warmup {
            sum += took;
            histogram.saturating_record((took.as_micros() as u64).max(1));
        }
    }
    drop(stream);
    server
        .join()
        .map_err(|_| anyhow::anyhow!("echo thread panicked"))??;
    let mean_us = sum.as_secs_f64() * 1e6 / args.iterations as f64;
    let p = |q: f64| histogram.value_at_quantile(q);
    if args.json {
        let out = serde_json::json!({
            "request_bytes": args.request_bytes,
            "reply_bytes": args.reply_bytes,
            "iterations": args.iterations,
            "mean_us": mean_us,
            "p50_us": p(0.5),
            "p99_us": p(0.99),
            "p999_us": p(0.999),
            "min_us": histogram.min(),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "loopback TCP round trip, {} B request / {} B reply, {} iterations: mean {mean_us:.1} us, \
             p50 {} us, p99 {} us, p99.9 {} us, min {} us",
            args.request_bytes,
            args.reply_bytes,
            args.iterations,
            p(0.5),
            p(0.99),
            p(0.999),
            histogram.min()
        );
    }
    Ok(())
}
