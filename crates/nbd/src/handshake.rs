//! The handshake phase on a connection: greeting, client flags, then option haggling until
//! the client picks an export (`GO` or `EXPORT_NAME`), aborts, goes away, or asks for TLS
//! (`STARTTLS`). Parsing and encoding are the sans-IO `option` and `option_reply`, the TLS
//! gate and the allow lists the sans-IO `access`; this module reads, decides and writes.
//!
//! TLS: on `STARTTLS` the server acknowledges, and [`Handshake::run`] returns
//! [`Outcome::StartTls`]; the caller runs the TLS handshake on the same socket, calls
//! [`Handshake::on_tls`], and runs the handshake again on the TLS stream, where haggling goes
//! on. What was negotiated in the clear (structured replies, a metadata context) is forgotten
//! then: a man in the middle could have chosen it.
//!
//! Limits: each option payload is read only if it is at most `OPTION_BYTES_MAX` (larger ones
//! are skipped and answered `NBD_REP_ERR_TOO_BIG`, absurd ones disconnect), and a connection
//! gets `OPTIONS_PER_CONNECTION_MAX` options, before and after TLS together. The caller bounds
//! the whole phase by a timeout.

use crate::access::{gate, AllowList, Gate, Peer, TlsMode};
use crate::backend::{Export, ExportError, Exports};
use crate::consts::*;
use crate::local_users::LocalUsers;
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
    /// `STARTTLS` was acknowledged: the next bytes are the client's TLS handshake.
    StartTls,
}

/// Why the server ends a connection during the handshake (a hard disconnect).
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("socket: {0}")]
    Io(std::io::Error),
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

// The message includes the cause's, so the cause is not also its `source()` (a printed
// chain would say it twice): `From` by hand instead of `#[from]`.
impl From<std::io::Error> for HandshakeError {
    fn from(e: std::io::Error) -> Self {
        HandshakeError::Io(e)
    }
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

/// Who may do what on this server: the TLS mode, the allow lists and the users of this host
/// let in.
#[derive(Clone, Copy)]
pub struct Policy<'a> {
    pub tls: TlsMode,
    pub allow: &'a AllowList,
    pub local_users: &'a LocalUsers,
    /// The server's own user id (let in by the local-users gate).
    pub server_uid: u32,
}

/// The handshake of one connection, kept across the TLS upgrade.
pub struct Handshake<'a, E> {
    exports: &'a E,
    policy: Policy<'a>,
    peer: Peer,
    /// How the connection is named in log lines.
    label: &'a str,
    state: State,
    greeted: bool,
    tls_active: bool,
    options_used: u32,
    /// A refusal was logged: one line per connection, not one per option (qemu sends three
    /// before giving up).
    refusal_logged: bool,
}

impl<'a, E: Exports> Handshake<'a, E> {
    pub fn new(exports: &'a E, policy: Policy<'a>, peer: Peer, label: &'a str) -> Self {
        Handshake {
            exports,
            policy,
            peer,
            label,
            state: State::default(),
            greeted: false,
            tls_active: false,
            options_used: 0,
            refusal_logged: false,
        }
    }

    /// The TLS handshake after `STARTTLS` succeeded, with the verified client certificate's
    /// common name (if the server asks for one). Haggling restarts from a clean state.
    pub fn on_tls(&mut self, common_name: Option<String>) {
        assert!(!self.tls_active, "STARTTLS is acknowledged once");
        self.tls_active = true;
        self.peer.common_name = common_name;
        self.state = State {
            no_zeroes: self.state.no_zeroes,
            ..State::default()
        };
    }

    /// Runs option haggling on `io` until it ends (or TLS is to start).
    pub async fn run<S>(&mut self, io: &mut S) -> Result<Outcome<E::Export>, HandshakeError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let mut buf = BytesMut::with_capacity(256);
        if !self.greeted {
            self.greeted = true;
            out::put_greeting(&mut buf);
            send(io, &mut buf).await?;
            let mut flags = [0u8; 4];
            if !read_or_eof(io, &mut flags).await? {
                return Ok(Outcome::Closed);
            }
            self.state.no_zeroes = parse_client_flags(&flags)?;
        }
        while self.options_used < OPTIONS_PER_CONNECTION_MAX {
            self.options_used += 1;
            let mut header = [0u8; OPTION_HEADER_BYTES];
            if !read_or_eof(io, &mut header).await? {
                return Ok(Outcome::Closed);
            }
            let header = OptionHeader::parse(&header)?;
            let Some(payload) = read_payload(io, &header, &mut buf).await? else {
                continue;
            };
            let done = self.on_option_bytes(&header, &payload, &mut buf).await?;
            send(io, &mut buf).await?;
            if let Some(outcome) = done {
                return Ok(outcome);
            }
        }
        Err(HandshakeError::TooManyOptions)
    }

    /// The TLS gate, then the option itself.
    async fn on_option_bytes(
        &mut self,
        header: &OptionHeader,
        payload: &[u8],
        buf: &mut BytesMut,
    ) -> Result<Option<Outcome<E::Export>>, HandshakeError> {
        let code = header.option;
        if let Some(why) = self.local_refusal(code) {
            if code == OPT_EXPORT_NAME {
                return Err(HandshakeError::ExportName {
                    name: String::from_utf8_lossy(payload).into_owned(),
                    why: format!("{why}; disconnecting (EXPORT_NAME cannot carry an error)"),
                });
            }
            if !std::mem::replace(&mut self.refusal_logged, true) {
                tracing::warn!(
                    peer = self.label,
                    "option {code} refused: {why}; replied NBD_REP_ERR_POLICY"
                );
            }
            out::put_error(buf, code, REP_ERR_POLICY, &why);
            return Ok(None);
        }
        match gate(self.policy.tls, self.tls_active, code) {
            Gate::Proceed => {}
            Gate::TlsRequired => {
                let why = "TLS is required (--tls require): send NBD_OPT_STARTTLS first";
                tracing::warn!(
                    peer = self.label,
                    "option {code} refused: {why}; replied NBD_REP_ERR_TLS_REQD"
                );
                out::put_error(buf, code, REP_ERR_TLS_REQD, why);
                return Ok(None);
            }
            Gate::Disconnect => {
                return Err(HandshakeError::ExportName {
                    name: String::from_utf8_lossy(payload).into_owned(),
                    why: "TLS is required (--tls require) and EXPORT_NAME cannot carry \
                          NBD_REP_ERR_TLS_REQD: disconnecting"
                        .into(),
                })
            }
            Gate::RefuseStartTls(reply) => {
                let why = if reply == REP_ERR_INVALID {
                    "TLS is already running"
                } else {
                    "this server does not offer TLS (--tls off)"
                };
                out::put_error(buf, code, reply, why);
                return Ok(None);
            }
            Gate::StartTls if !payload.is_empty() => {
                out::put_error(buf, code, REP_ERR_INVALID, "STARTTLS carries no data");
                return Ok(None);
            }
            Gate::StartTls => {
                out::put_ack(buf, code);
                return Ok(Some(Outcome::StartTls));
            }
        }
        let option = match parse_option(code, payload) {
            Ok(option) => option,
            Err(OptionError::Invalid { why, .. }) if code == OPT_EXPORT_NAME => {
                return Err(HandshakeError::ExportName {
                    name: String::from_utf8_lossy(payload).into_owned(),
                    why,
                })
            }
            Err(OptionError::Invalid { why, .. }) => {
                out::put_error(buf, code, REP_ERR_INVALID, &why);
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        self.on_option(option, code, buf).await
    }

    /// Why the local-users gate refuses option `code` of this client, if it does: a client
    /// on this host whose user the server does not let in (`--local-users`), unless it
    /// proved itself with a verified certificate. `ABORT` and `STARTTLS` pass, so that such
    /// a client can still authenticate with its certificate.
    fn local_refusal(&self, code: u32) -> Option<String> {
        let local = self.peer.local?;
        if code == OPT_ABORT
            || code == OPT_STARTTLS
            || self.peer.common_name.is_some()
            || self
                .policy
                .local_users
                .admits(local.uid, self.policy.server_uid)
        {
            return None;
        }
        let who = match local.uid {
            Some(uid) => format!("local user uid {uid}"),
            None => "a local client whose user could not be found".to_string(),
        };
        Some(format!(
            "{who} may not use this server: it lets in root, its own user and the users \
             --local-users names (or a client certificate, with --tls-verify-peer)"
        ))
    }

    /// Whether the allow lists let this client use `name`; logs the (first) refusal if not.
    fn allowed(&mut self, code: u32, name: &str) -> bool {
        let allowed = self.policy.allow.allows(name, &self.peer);
        if !allowed && !std::mem::replace(&mut self.refusal_logged, true) {
            let reply = if code == OPT_EXPORT_NAME {
                "disconnected (EXPORT_NAME cannot carry an error)"
            } else {
                "replied NBD_REP_ERR_POLICY"
            };
            tracing::warn!(
                peer = self.label,
                common_name = ?self.peer.common_name,
                "option {code} for export {name:?} refused: the client is not on its allow list; {reply}"
            );
        }
        allowed
    }

    /// Acts on one parsed option: appends its replies to `buf`; returns how haggling ends, if
    /// it does.
    async fn on_option(
        &mut self,
        option: ClientOption,
        code: u32,
        buf: &mut BytesMut,
    ) -> Result<Option<Outcome<E::Export>>, HandshakeError> {
        match option {
            ClientOption::ExportName(name) => {
                if !self.allowed(code, &name) {
                    return Err(HandshakeError::ExportName {
                        name,
                        why: NOT_ALLOWED.into(),
                    });
                }
                let export =
                    self.exports
                        .open(&name)
                        .await
                        .map_err(|e| HandshakeError::ExportName {
                            name: name.clone(),
                            why: e.to_string(),
                        })?;
                let negotiated = self.state.negotiated(&name, export.size_bytes());
                let flags = out::transmission_flags(negotiated.structured, export.read_only());
                let no_zeroes = self.state.no_zeroes;
                out::put_export_name_answer(buf, negotiated.size_bytes, flags, no_zeroes);
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
            ClientOption::List => match self.exports.list().await {
                Ok(names) => {
                    let allow = self.policy.allow;
                    for name in names.iter().filter(|n| allow.allows(n, &self.peer)) {
                        out::put_server(buf, name);
                    }
                    out::put_ack(buf, code);
                }
                Err(e) => out::put_error(buf, code, REP_ERR_POLICY, &e.to_string()),
            },
            // The gate answered STARTTLS before parsing.
            ClientOption::StartTls => unreachable!("STARTTLS is handled by the TLS gate"),
            ClientOption::StructuredReply => {
                self.state.structured = true;
                out::put_ack(buf, code);
            }
            ClientOption::Info { go, name, requests } => {
                if !self.allowed(code, &name) {
                    out::put_error(buf, code, REP_ERR_POLICY, NOT_ALLOWED);
                    return Ok(None);
                }
                return on_info(go, name, &requests, code, &self.state, self.exports, buf).await;
            }
            ClientOption::MetaContext { set, name, queries } => {
                if !self.allowed(code, &name) {
                    out::put_error(buf, code, REP_ERR_POLICY, NOT_ALLOWED);
                    return Ok(None);
                }
                on_meta_context(
                    set,
                    name,
                    &queries,
                    code,
                    &mut self.state,
                    self.exports,
                    buf,
                )
                .await
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
}

/// The message of a refusal by the allow lists (the same whether the export exists or not,
/// so that a refused client learns nothing about which images exist).
const NOT_ALLOWED: &str = "this client is not on the export's allow list";

/// Reads an option's payload, or skips an oversized one (answering `TOO_BIG`) and returns
/// `None`.
async fn read_payload<S>(
    io: &mut S,
    header: &OptionHeader,
    buf: &mut BytesMut,
) -> Result<Option<Vec<u8>>, HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    if header.length > OPTION_SKIP_BYTES_MAX {
        return Err(HandshakeError::OptionTooLarge(header.length));
    }
    if header.length > OPTION_BYTES_MAX {
        skip(io, u64::from(header.length)).await?;
        if header.option == OPT_EXPORT_NAME {
            return Err(HandshakeError::ExportName {
                name: String::new(),
                why: format!("name of {} bytes", header.length),
            });
        }
        let why = format!("option payload over {OPTION_BYTES_MAX} bytes");
        out::put_error(buf, header.option, REP_ERR_TOO_BIG, &why);
        send(io, buf).await?;
        return Ok(None);
    }
    let mut payload = vec![0u8; header.length as usize];
    io.read_exact(&mut payload).await?;
    Ok(Some(payload))
}

/// `INFO` and `GO`: describe the export (size and flags always, block sizes always, name and
/// description when asked); `GO` then enters transmission.
async fn on_info<E: Exports>(
    go: bool,
    name: String,
    requests: &[u16],
    code: u32,
    state: &State,
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
    let flags = out::transmission_flags(negotiated.structured, export.read_only());
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
