//! The three copy loops. Each walks its source window by window ([`plan::windows`]), moves
//! only the ranges holding data, chunk by chunk ([`plan::chunks`]), with at most
//! `--chunks-in-flight` chunks in flight ([`Flight`], [`Ordered`]).

use super::flight::{Flight, Ordered};
use super::input::{data_ranges, read_exact_at, read_stream, Input};
use super::output::Output;
use super::plan::{self, Summary, CHUNK_BYTES_MAX};
use super::target::{self, CP_MARKER, IMPORT_MARKER};
use super::{progress_bar, summary};
use crate::command::{CopyArgs, ExportArgs, ImageOrSnap, ImageSpec, ImportArgs, Invocation};
use crate::exit::{Failure, Worded};
use anyhow::{anyhow, Context, Result};
use fastblock_client::zeros::zero_runs;
use fastblock_client::{Bytes, Cluster, Image};
use fastblock_monclient::MonClient;
use indicatif::ProgressBar;
use std::fs::File;
use std::io::Read;
use std::sync::Arc;
use std::time::Instant;
use tokio::task::spawn_blocking;

/// Moves the bar forward to `position` (never back: the windows are walked ahead of the
/// chunks still in flight).
fn advance(bar: &ProgressBar, position: u64) {
    if position > bar.position() {
        bar.set_position(position);
    }
}

/// `image import`: the input's data into a new image.
pub async fn import(
    inv: &Invocation,
    client: &MonClient,
    args: &ImportArgs,
    started: Instant,
) -> Result<Summary> {
    let input = Input::open(&args.source)?;
    let name = input.name().to_string();
    let size = plan::import_size(input.len_bytes(), args.size_bytes)
        .map_err(|e| anyhow!("importing {name}: {e}"))?;
    // Reach the cluster before creating anything, so that an unreachable one leaves nothing.
    let cluster = crate::snap::connect(inv, client).await?;
    let spec = &args.target;
    target::create(
        client,
        spec,
        size,
        args.object_size_bytes,
        args.overwrite,
        IMPORT_MARKER,
    )
    .await?;
    let bar = progress_bar(format!("importing {name} into {spec}"), size);
    let moved = async {
        let image = cluster.open_image(&spec.pool, &spec.image).await?;
        let data_bytes = match input {
            Input::File {
                file, len_bytes, ..
            } => {
                import_file(
                    &image,
                    file,
                    len_bytes,
                    &name,
                    args.chunks_in_flight_max,
                    &bar,
                )
                .await?
            }
            Input::Stream { reader, .. } => {
                import_stream(&image, reader, size, &name, args.chunks_in_flight_max, &bar).await?
            }
        };
        image.flush().await?;
        anyhow::Ok(data_bytes)
    }
    .await;
    bar.finish_and_clear();
    let data_bytes = moved.map_err(|e| target::interrupted(spec, IMPORT_MARKER, e))?;
    target::complete(client, spec, IMPORT_MARKER).await?;
    Ok(summary(
        "imported",
        name,
        spec.to_string(),
        size,
        data_bytes,
        started,
    ))
}

/// A regular file or device: the data ranges of each window, read at their offsets.
async fn import_file(
    image: &Image,
    file: Arc<File>,
    len_bytes: u64,
    name: &str,
    chunks_in_flight_max: usize,
    bar: &ProgressBar,
) -> Result<u64> {
    let mut flight = Flight::new(chunks_in_flight_max);
    for (window, window_len) in plan::windows(len_bytes) {
        let f = file.clone();
        let ranges = spawn_blocking(move || data_ranges(&f, window, window + window_len))
            .await?
            .with_context(|| format!("finding the data of {name} (SEEK_DATA)"))?;
        for (offset, len) in plan::chunks(&ranges) {
            let (file, image, name) = (file.clone(), image.clone(), name.to_string());
            flight
                .spawn(async move {
                    let data =
                        spawn_blocking(move || read_exact_at(&file, &name, offset, len)).await??;
                    write_data(image, offset, data.into()).await
                })
                .await?;
            // `spawn` waited for room: the chunks before this one are at most a flight away.
            advance(bar, offset + len);
        }
        advance(bar, window + window_len);
    }
    flight.finish().await
}

/// A stream: read in order, chunk by chunk; it must hold exactly `size_bytes` (it was the
/// image's size, `--size`: fewer bytes would leave a silently cut copy, more would be lost).
async fn import_stream(
    image: &Image,
    mut reader: Box<dyn Read + Send>,
    size_bytes: u64,
    name: &str,
    chunks_in_flight_max: usize,
    bar: &ProgressBar,
) -> Result<u64> {
    let mut flight = Flight::new(chunks_in_flight_max);
    let mut offset = 0;
    // One blocking read at a time, the reader moved to the blocking pool and back.
    let read = |mut reader: Box<dyn Read + Send>, len: u64| {
        let name = name.to_string();
        spawn_blocking(move || {
            let data = read_stream(&mut reader, &name, len);
            (reader, data)
        })
    };
    while offset < size_bytes {
        let len = CHUNK_BYTES_MAX.min(size_bytes - offset);
        let (back, data) = read(reader, len).await?;
        reader = back;
        let data = data?;
        if (data.len() as u64) < len {
            return Err(anyhow!(
                "short read: {name} ended after {} bytes, --size is {size_bytes} bytes",
                offset + data.len() as u64
            ));
        }
        flight
            .spawn(write_data(image.clone(), offset, data.into()))
            .await?;
        offset += len;
        advance(bar, offset);
    }
    let (_, extra) = read(reader, 1).await?;
    if !extra?.is_empty() {
        return Err(anyhow!(
            "{name} holds more than --size ({size_bytes} bytes): give its whole size"
        ));
    }
    flight.finish().await
}

/// Writes the parts of `data` (the image's bytes at `offset`) that are not all-zero blocks;
/// returns how many bytes that was. The image is new, so its holes already read as zeros.
async fn write_data(image: Image, offset: u64, data: Bytes) -> Result<u64> {
    let mut written = 0;
    for run in zero_runs(offset, &data).into_iter().filter(|r| !r.zero) {
        let at = offset + run.start as u64;
        image
            .write(at, data.slice(run.start..run.start + run.len))
            .await
            .with_context(|| format!("writing {} at byte {at}", spec_of(&image)))?;
        written += run.len as u64;
    }
    Ok(written)
}

fn spec_of(image: &Image) -> String {
    let info = image.info();
    match image.snapshot() {
        Some(snap) => format!("{}/{}@{}", info.pool_name, info.name, snap.name),
        None => format!("{}/{}", info.pool_name, info.name),
    }
}

async fn open_source(cluster: &Arc<Cluster>, source: &ImageOrSnap) -> Result<Image> {
    let ImageSpec { pool, image } = &source.image;
    Ok(match &source.snap {
        None => cluster.open_image(pool, image).await?,
        Some(snap) => cluster.open_snapshot(pool, image, snap).await?,
    })
}

/// `image export`: the image's data into a sparse file, or every byte into a stream.
pub async fn export(
    inv: &Invocation,
    client: &MonClient,
    args: &ExportArgs,
    started: Instant,
) -> Result<Summary> {
    let cluster = crate::snap::connect(inv, client).await?;
    // The source first: a missing or incomplete image leaves no file behind.
    let image = open_source(&cluster, &args.source).await?;
    target::check_complete(client, &args.source.image).await?;
    let output = Output::open(&args.target, args.overwrite)?;
    let name = output.name().to_string();
    let size = image.size_bytes();
    let bar = progress_bar(format!("exporting {} to {name}", args.source), size);
    let moved = export_into(&image, output, size, args.chunks_in_flight_max, &bar).await;
    bar.finish_and_clear();
    let data_bytes =
        moved.map_err(|e| Worded::error(format!("{e:#}; {name} holds a partial copy"), e))?;
    Ok(summary(
        "exported",
        args.source.to_string(),
        name,
        size,
        data_bytes,
        started,
    ))
}

/// Reads the allocated chunks in order, `chunks_in_flight_max` at once, and writes each as
/// it comes (the output is moved to the blocking pool for every write and back).
async fn export_into(
    image: &Image,
    mut output: Output,
    size_bytes: u64,
    chunks_in_flight_max: usize,
    bar: &ProgressBar,
) -> Result<u64> {
    let mut reads = Ordered::new(chunks_in_flight_max);
    let mut data_bytes = 0;
    for (window, window_len) in plan::windows(size_bytes) {
        let ranges = image
            .allocated_ranges(window, window_len)
            .await
            .with_context(|| format!("asking where {} holds data", spec_of(image)))?;
        for (offset, len) in plan::chunks(&ranges) {
            let image = image.clone();
            let read = async move {
                let data = image
                    .read(offset, len)
                    .await
                    .with_context(|| format!("reading {} at byte {offset}", spec_of(&image)))?;
                anyhow::Ok((offset, data))
            };
            if let Some(done) = reads.push(read).await? {
                let written;
                (output, written) = write_out(output, done, bar).await?;
                data_bytes += written;
            }
        }
        advance(bar, window + window_len);
    }
    while let Some(done) = reads.next().await {
        let written;
        (output, written) = write_out(output, done?, bar).await?;
        data_bytes += written;
    }
    spawn_blocking(move || output.finish(size_bytes)).await??;
    Ok(data_bytes)
}

async fn write_out(
    mut output: Output,
    (offset, data): (u64, Bytes),
    bar: &ProgressBar,
) -> Result<(Output, u64)> {
    advance(bar, offset + data.len() as u64);
    let (output, written) = spawn_blocking(move || {
        let written = output.write(offset, &data);
        (output, written)
    })
    .await?;
    Ok((output, written?))
}

/// `image cp`: the source's data into a new image of its size.
pub async fn cp(
    inv: &Invocation,
    client: &MonClient,
    args: &CopyArgs,
    started: Instant,
) -> Result<Summary> {
    let spec = &args.target;
    if args.source.image == *spec {
        return Err(Failure::Usage(format!(
            "{} cannot be copied onto its own image {spec}",
            args.source
        ))
        .into());
    }
    let cluster = crate::snap::connect(inv, client).await?;
    let source = open_source(&cluster, &args.source).await?;
    target::check_complete(client, &args.source.image).await?;
    let size = source.size_bytes();
    let object_size = args
        .object_size_bytes
        .unwrap_or(source.info().object_size_bytes);
    target::create(
        client,
        spec,
        size,
        Some(object_size),
        args.overwrite,
        CP_MARKER,
    )
    .await?;
    let bar = progress_bar(format!("copying {} to {spec}", args.source), size);
    let moved = async {
        let target = cluster.open_image(&spec.pool, &spec.image).await?;
        let data_bytes = copy_into(&source, &target, args.chunks_in_flight_max, &bar).await?;
        target.flush().await?;
        anyhow::Ok(data_bytes)
    }
    .await;
    bar.finish_and_clear();
    let data_bytes = moved.map_err(|e| target::interrupted(spec, CP_MARKER, e))?;
    target::complete(client, spec, CP_MARKER).await?;
    Ok(summary(
        "copied",
        args.source.to_string(),
        spec.to_string(),
        size,
        data_bytes,
        started,
    ))
}

async fn copy_into(
    source: &Image,
    target: &Image,
    chunks_in_flight_max: usize,
    bar: &ProgressBar,
) -> Result<u64> {
    let mut flight = Flight::new(chunks_in_flight_max);
    for (window, window_len) in plan::windows(source.size_bytes()) {
        let ranges = source
            .allocated_ranges(window, window_len)
            .await
            .with_context(|| format!("asking where {} holds data", spec_of(source)))?;
        for (offset, len) in plan::chunks(&ranges) {
            let (source, target) = (source.clone(), target.clone());
            flight
                .spawn(async move {
                    let data = source.read(offset, len).await.with_context(|| {
                        format!("reading {} at byte {offset}", spec_of(&source))
                    })?;
                    write_data(target, offset, data).await
                })
                .await?;
            advance(bar, offset + len);
        }
        advance(bar, window + window_len);
    }
    flight.finish().await
}
