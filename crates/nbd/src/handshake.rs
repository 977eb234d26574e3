//! The handshake phase on a connection: greeting, client flags, then option haggling until
//! the client picks an export (`GO` or `EXPORT_NAME`), aborts, or goes away. Parsing and
//! encoding are the sans-IO `option` and `option_reply`; this module reads, decides and
//! writes.
//!
//! Limits: each option payload is read only if it is at most `OPTION_BYTES_MAX` (larger ones
//! are skipped and answered `NBD_REP_ERR_TOO_BIG`, absurd ones disconnect), and a connection
//! gets `OPTIONS_PER_CONNECTION_MAX` options. The caller bounds the whole phase by a timeout.

use crate::backend::{Export, ExportError, Exports};
use crate::consts::*;
use crate::option::{meta_contexts, parse_client_flags, parse_option, ClientOption};
use crate::option::{OptionError, OptionHeader};
use crate::option_reply as out;
use crate::request::Negotiated;
use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// How option haggling ended.
pub enum Outcome<X> {
    /// Enter transmission with this export.
    Transmission {
        name: String,
        export: X,
        negotiated: Negotiated,
    },
    /// The client aborted or closed the connection cleanly.
    Closed,
}

/// Why the server ends a connection during the handshake (a hard disconnect).
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Protocol(#[from] OptionError),
    #[error("option payload of {0} bytes; not even skipping it")]
    OptionTooLarge(u32),
    #[error("more than {OPTIONS_PER_CONNECTION_MAX} options without choosing an export")]
    TooManyOptions,
    /// `EXPORT_NAME` cannot answer an error: the spec says to disconnect.
    #[error("EXPORT_NAME {name:?}: {why}")]
    ExportName { name: String, why: String },
}

/// What the client negotiated so far.
#[derive(Default)]
struct State {
    no_zeroes: bool,
    structured: bool,
    /// The export `base:allocation` was selected for by `SET_META_CONTEXT`.
    allocation_for: Option<String>,
}

impl State {
    fn negotiated(&self, name: &str, size_bytes: u64) -> Negotiated {
        Negotiated {
            size_bytes,
            structured: self.structured,
            // A context selected for another export does not carry over to this one.
            allocation_context: self.structured && self.allocation_for.as_deref() == Some(name),
        }
    }
}

/// Runs the handshake on `reader`/`writer` (the two halves of one connection).
pub async fn negotiate<R, W, E>(
    reader: &mut R,
    writer: &mut W,
    exports: &E,
) -> Result<Outcome<E::Export>, HandshakeError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    E: Exports,
{
    let mut buf = BytesMut::with_capacity(256);
    out::put_greeting(&mut buf);
    send(writer, &mut buf).await?;
    let mut flags = [0u8; 4];
    if !read_or_eof(reader, &mut flags).await? {
        return Ok(Outcome::Closed);
    }
    let mut state = State {
        no_zeroes: parse_client_flags(&flags)?,
        ..State::default()
    };
    for _ in 0..OPTIONS_PER_CONNECTION_MAX {
        let mut header = [0u8; OPTION_HEADER_BYTES];
        if !read_or_eof(reader, &mut header).await? {
            return Ok(Outcome::Closed);
        }
        let header = OptionHeader::parse(&header)?;
        let Some(payload) = read_payload(reader, writer, &header, &mut buf).await? else {
            continue;
        };
        let option = match parse_option(header.option, &payload) {
            Ok(option) => option,
            Err(OptionError::Invalid { why, .. }) if header.option == OPT_EXPORT_NAME => {
                return Err(HandshakeError::ExportName {
                    name: String::from_utf8_lossy(&payload).into_owned(),
                    why,
                })
            }
            Err(OptionError::Invalid { why, .. }) => {
                out::put_error(&mut buf, header.option, REP_ERR_INVALID, &why);
                send(writer, &mut buf).await?;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let done = on_option(option, header.option, &mut state, exports, &mut buf).await?;
        send(writer, &mut buf).await?;
        if let Some(outcome) = done {
            return Ok(outcome);
        }
    }
    Err(HandshakeError::TooManyOptions)
}

/// Reads an option's payload, or skips an oversized one (answering `TOO_BIG`) and returns
/// `None`.
async fn read_payload<R, W>(
    reader: &mut R,
    writer: &mut W,
    header: &OptionHeader,
    buf: &mut BytesMut,
) -> Result<Option<Vec<u8>>, HandshakeError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    if header.length > OPTION_SKIP_BYTES_MAX {
        return Err(HandshakeError::OptionTooLarge(header.length));
    }
    if header.length > OPTION_BYTES_MAX {
        skip(reader, u64::from(header.length)).await?;
        if header.option == OPT_EXPORT_NAME {
            return Err(HandshakeError::ExportName {
                name: String::new(),
                why: format!("name of {} bytes", header.length),
            });
        }
        let why = format!("option payload over {OPTION_BYTES_MAX} bytes");
        out::put_error(buf, header.option, REP_ERR_TOO_BIG, &why);
        send(writer, buf).await?;
        return Ok(None);
    }
    let mut payload = vec![0u8; header.length as usize];
    reader.read_exact(&mut payload).await?;
    Ok(Some(payload))
}

/// Acts on one parsed option: appends its replies to `buf`; returns how haggling ends, if it
/// does.
async fn on_option<E: Exports>(
    option: ClientOption,
    code: u32,
    state: &mut State,
    exports: &E,
    buf: &mut BytesMut,
) -> Result<Option<Outcome<E::Export>>, HandshakeError> {
    match option {
        ClientOption::ExportName(name) => {
            let export = exports
                .open(&name)
                .await
                .map_err(|e| HandshakeError::ExportName {
                    name: name.clone(),
                    why: e.to_string(),
                })?;
            let negotiated = state.negotiated(&name, export.size_bytes());
            let flags = out::transmission_flags(negotiated.structured);
            out::put_export_name_answer(buf, negotiated.size_bytes, flags, state.no_zeroes);
            return Ok(Some(Outcome::Transmission {
                name,
                export,
                negotiated,
            }));
        }
        ClientOption::Abort => {
            out::put_ack(buf, code);
            return Ok(Some(Outcome::Closed));
        }
        ClientOption::List => match exports.list().await {
            Ok(names) => {
                for name in names {
                    out::put_server(buf, &name);
                }
                out::put_ack(buf, code);
            }
            Err(e) => out::put_error(buf, code, REP_ERR_POLICY, &e.to_string()),
        },
        ClientOption::StartTls => {
            out::put_error(buf, code, REP_ERR_UNSUP, "this server does not offer TLS")
        }
        ClientOption::StructuredReply => {
            state.structured = true;
            out::put_ack(buf, code);
        }
        ClientOption::Info { go, name, requests } => {
            return on_info(go, name, &requests, code, state, exports, buf).await;
        }
        ClientOption::MetaContext { set, name, queries } => {
            on_meta_context(set, name, &queries, code, state, exports, buf).await
        }
        ClientOption::Unknown(other) => out::put_error(
            buf,
            code,
            REP_ERR_UNSUP,
            &format!("option {other} is not supported"),
        ),
    }
    Ok(None)
}

/// `INFO` and `GO`: describe the export (size and flags always, block sizes always, name and
/// description when asked); `GO` then enters transmission.
async fn on_info<E: Exports>(
    go: bool,
    name: String,
    requests: &[u16],
    code: u32,
    state: &mut State,
    exports: &E,
    buf: &mut BytesMut,
) -> Result<Option<Outcome<E::Export>>, HandshakeError> {
    let export = match exports.open(&name).await {
        Ok(export) => export,
        Err(e) => {
            out::put_error(buf, code, export_error_reply(&e), &e.to_string());
            return Ok(None);
        }
    };
    let negotiated = state.negotiated(&name, export.size_bytes());
    let flags = out::transmission_flags(negotiated.structured);
    out::put_info_export(buf, code, negotiated.size_bytes, flags);
    if requests.contains(&INFO_NAME) {
        out::put_info_text(buf, code, INFO_NAME, &name);
    }
    if requests.contains(&INFO_DESCRIPTION) {
        let description = export.description();
        out::put_info_text(buf, code, INFO_DESCRIPTION, out::cut(&description));
    }
    // Sent unasked too: the minimum of 1 byte constrains nothing, and clients learn the
    // maximum payload instead of guessing.
    out::put_info_block_size(buf, code);
    out::put_ack(buf, code);
    if !go {
        return Ok(None);
    }
    Ok(Some(Outcome::Transmission {
        name,
        export,
        negotiated,
    }))
}

/// `LIST_META_CONTEXT` / `SET_META_CONTEXT` for `base:allocation`, which needs structured
/// replies (block status is a structured reply).
async fn on_meta_context<E: Exports>(
    set: bool,
    name: String,
    queries: &[String],
    code: u32,
    state: &mut State,
    exports: &E,
    buf: &mut BytesMut,
) {
    if !state.structured {
        let why = "negotiate structured replies before metadata contexts";
        out::put_error(buf, code, REP_ERR_INVALID, why);
        return;
    }
    if let Err(e) = exports.open(&name).await {
        out::put_error(buf, code, export_error_reply(&e), &e.to_string());
        return;
    }
    let contexts = meta_contexts(set, queries);
    // The id is reserved (0) in LIST answers; SET gives the id block status replies carry.
    let id = if set { META_BASE_ALLOCATION_ID } else { 0 };
    for context in &contexts {
        out::put_meta_context(buf, code, id, context);
    }
    if set {
        state.allocation_for = (!contexts.is_empty()).then_some(name);
    }
    out::put_ack(buf, code);
}

fn export_error_reply(e: &ExportError) -> u32 {
    match e {
        ExportError::NotFound(_) | ExportError::Unavailable(_) => REP_ERR_UNKNOWN,
        ExportError::BadName(_) => REP_ERR_INVALID,
    }
}

async fn send<W: AsyncWrite + Unpin>(writer: &mut W, buf: &mut BytesMut) -> std::io::Result<()> {
    if !buf.is_empty() {
        writer.write_all(buf).await?;
        writer.flush().await?;
        buf.clear();
    }
    Ok(())
}

/// Fills `out`; `false` if the peer closed the connection before the first byte.
async fn read_or_eof<R: AsyncRead + Unpin>(
    reader: &mut R,
    out: &mut [u8],
) -> std::io::Result<bool> {
    let first = reader.read(&mut out[..1]).await?;
    if first == 0 {
        return Ok(false);
    }
    reader.read_exact(&mut out[1..]).await?;
    Ok(true)
}

/// Reads and drops `len` bytes, 64 KiB at a time.
pub(crate) async fn skip<R: AsyncRead + Unpin>(reader: &mut R, len: u64) -> std::io::Result<()> {
    let mut sink = tokio::io::sink();
    let copied = tokio::io::copy(&mut reader.take(len), &mut sink).await?;
    if copied != len {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}
