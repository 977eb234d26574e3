//! Handshake parsing, sans IO: the client flags, the option header, and each option's payload
//! into a [`ClientOption`]. The handshake driver (`handshake`) reads the bytes and acts.
//!
//! Layouts (all big-endian), from the NBD protocol's "Option types":
//! - header: magic `IHAVEOPT` u64, option u32, length u32, then `length` bytes;
//! - `EXPORT_NAME`: the name is the whole payload;
//! - `INFO`, `GO`: name length u32, name, request count u16, that many info types u16;
//! - `LIST_META_CONTEXT`, `SET_META_CONTEXT`: name length u32, name, query count u32, then
//!   per query a length u32 and the query;
//! - `ABORT`, `LIST`, `STARTTLS`, `STRUCTURED_REPLY`: no payload.

use crate::be::{BeReader, Short};
use crate::consts::*;

/// What a client may ask during option haggling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientOption {
    /// Old way into transmission: no error can be answered, an unknown export disconnects.
    ExportName(String),
    Abort,
    List,
    StartTls,
    /// Describe an export (`go == false`) or also enter transmission with it (`go == true`).
    Info {
        go: bool,
        name: String,
        requests: Vec<u16>,
    },
    StructuredReply,
    /// List (`set == false`) or select (`set == true`) metadata contexts of an export.
    MetaContext {
        set: bool,
        name: String,
        queries: Vec<String>,
    },
    /// An option this server does not implement (answered `NBD_REP_ERR_UNSUP`).
    Unknown(u32),
}

/// The fixed 16 bytes in front of every option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub length: u32,
}

/// Why a handshake message cannot be accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    /// The stream is not NBD (or lost its framing): the only answer is to disconnect.
    #[error("bad option magic {0:#x}")]
    BadMagic(u64),
    /// The client set flags this server does not know: the spec says to disconnect.
    #[error("unknown client flags {0:#x}")]
    UnknownClientFlags(u32),
    /// A well-framed option whose payload is malformed: answered `NBD_REP_ERR_INVALID`.
    #[error("option {option}: {why}")]
    Invalid { option: u32, why: String },
}

/// The client's 32-bit flags; whether it asked for `NO_ZEROES`.
pub fn parse_client_flags(bytes: &[u8; 4]) -> Result<bool, OptionError> {
    let flags = BeReader::new(bytes).u32("client flags").unwrap_or(u32::MAX);
    let known = CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES;
    if flags & !known != 0 {
        return Err(OptionError::UnknownClientFlags(flags));
    }
    Ok(flags & CLIENT_FLAG_NO_ZEROES != 0)
}

impl OptionHeader {
    pub fn parse(bytes: &[u8; OPTION_HEADER_BYTES]) -> Result<OptionHeader, OptionError> {
        let mut r = BeReader::new(bytes);
        // Reads of a 16-byte array cannot run short; map the impossible case anyway rather
        // than unwrap network input.
        let short = |_: Short| OptionError::BadMagic(0);
        let magic = r.u64("magic").map_err(short)?;
        if magic != OPTION_MAGIC {
            return Err(OptionError::BadMagic(magic));
        }
        Ok(OptionHeader {
            option: r.u32("option").map_err(short)?,
            length: r.u32("length").map_err(short)?,
        })
    }
}

/// Parses one option's payload (exactly `header.length` bytes).
pub fn parse_option(option: u32, payload: &[u8]) -> Result<ClientOption, OptionError> {
    let invalid = |why: String| OptionError::Invalid { option, why };
    let no_payload = |parsed: ClientOption| {
        if payload.is_empty() {
            Ok(parsed)
        } else {
            Err(invalid(format!(
                "{} unexpected payload bytes",
                payload.len()
            )))
        }
    };
    match option {
        OPT_EXPORT_NAME => Ok(ClientOption::ExportName(
            string(payload, "export name").map_err(invalid)?,
        )),
        OPT_ABORT => no_payload(ClientOption::Abort),
        OPT_LIST => no_payload(ClientOption::List),
        OPT_STARTTLS => no_payload(ClientOption::StartTls),
        OPT_STRUCTURED_REPLY => no_payload(ClientOption::StructuredReply),
        OPT_INFO | OPT_GO => parse_info(option == OPT_GO, payload).map_err(invalid),
        OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
            parse_meta(option == OPT_SET_META_CONTEXT, payload).map_err(invalid)
        }
        other => Ok(ClientOption::Unknown(other)),
    }
}

fn parse_info(go: bool, payload: &[u8]) -> Result<ClientOption, String> {
    let mut r = BeReader::new(payload);
    let name = sized_string(&mut r, "export name")?;
    let count = r.u16("info request count").map_err(|e| e.to_string())?;
    // Each request is 2 bytes: the count must match what follows exactly.
    if usize::from(count) * 2 != r.remaining() {
        return Err(format!(
            "{count} info requests announced, {} bytes follow",
            r.remaining()
        ));
    }
    let mut requests = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        requests.push(r.u16("info request").map_err(|e| e.to_string())?);
    }
    Ok(ClientOption::Info { go, name, requests })
}

fn parse_meta(set: bool, payload: &[u8]) -> Result<ClientOption, String> {
    let mut r = BeReader::new(payload);
    let name = sized_string(&mut r, "export name")?;
    let count = r.u32("query count").map_err(|e| e.to_string())?;
    // Every query takes at least its 4-byte length: bound the count by the bytes present
    // before anything is allocated from it.
    if count as usize > r.remaining() / 4 {
        return Err(format!(
            "{count} queries announced, only {} bytes follow",
            r.remaining()
        ));
    }
    let mut queries = Vec::with_capacity(count as usize);
    for _ in 0..count {
        queries.push(sized_string(&mut r, "query")?);
    }
    if r.remaining() != 0 {
        return Err(format!("{} trailing bytes", r.remaining()));
    }
    Ok(ClientOption::MetaContext { set, name, queries })
}

/// A u32 length, then that many bytes of string.
fn sized_string(r: &mut BeReader<'_>, what: &'static str) -> Result<String, String> {
    let len = r.u32(what).map_err(|e| e.to_string())?;
    if len as usize > STRING_BYTES_MAX {
        return Err(format!("{what} of {len} bytes is over {STRING_BYTES_MAX}"));
    }
    let bytes = r.take(len as usize, what).map_err(|e| e.to_string())?;
    string(bytes, what)
}

/// A protocol string: UTF-8, no NUL, at most [`STRING_BYTES_MAX`] bytes.
fn string(bytes: &[u8], what: &str) -> Result<String, String> {
    if bytes.len() > STRING_BYTES_MAX {
        return Err(format!(
            "{what} of {} bytes is over {STRING_BYTES_MAX}",
            bytes.len()
        ));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| format!("{what} is not UTF-8"))?;
    if text.contains('\0') {
        return Err(format!("{what} contains NUL"));
    }
    Ok(text.to_owned())
}

/// The metadata contexts a query list names, for `LIST` (a bare namespace or no query at
/// all lists everything) or `SET` (only exact names select). Unknown namespaces and names
/// select nothing, which is not an error.
pub fn meta_contexts(set: bool, queries: &[String]) -> Vec<&'static str> {
    let matches = |query: &str| query == META_BASE_ALLOCATION || (!set && query == "base:");
    if queries.is_empty() {
        return if set {
            Vec::new()
        } else {
            vec![META_BASE_ALLOCATION]
        };
    }
    if queries.iter().any(|q| matches(q)) {
        vec![META_BASE_ALLOCATION]
    } else {
        Vec::new()
    }
}

#[cfg(test)]
// NBD fields are big-endian; the tests build them by hand.
#[allow(clippy::big_endian_bytes)]
mod tests {
    use super::*;

    fn info_payload(name: &str, requests: &[u16]) -> Vec<u8> {
        let mut p = (name.len() as u32).to_be_bytes().to_vec();
        p.extend_from_slice(name.as_bytes());
        p.extend_from_slice(&(requests.len() as u16).to_be_bytes());
        for r in requests {
            p.extend_from_slice(&r.to_be_bytes());
        }
        p
    }

    fn meta_payload(name: &str, queries: &[&str]) -> Vec<u8> {
        let mut p = (name.len() as u32).to_be_bytes().to_vec();
        p.extend_from_slice(name.as_bytes());
        p.extend_from_slice(&(queries.len() as u32).to_be_bytes());
        for q in queries {
            p.extend_from_slice(&(q.len() as u32).to_be_bytes());
            p.extend_from_slice(q.as_bytes());
        }
        p
    }

    #[test]
    fn header_needs_the_option_magic() {
        let mut bytes = [0u8; OPTION_HEADER_BYTES];
        bytes[..8].copy_from_slice(&OPTION_MAGIC.to_be_bytes());
        bytes[8..12].copy_from_slice(&OPT_GO.to_be_bytes());
        bytes[12..16].copy_from_slice(&7u32.to_be_bytes());
        assert_eq!(
            OptionHeader::parse(&bytes),
            Ok(OptionHeader {
                option: OPT_GO,
                length: 7
            })
        );
        bytes[0] ^= 1;
        assert!(matches!(
            OptionHeader::parse(&bytes),
            Err(OptionError::BadMagic(_))
        ));
    }

    #[test]
    fn client_flags_beyond_the_two_known_ones_are_refused() {
        assert_eq!(parse_client_flags(&[0, 0, 0, 0]), Ok(false));
        assert_eq!(parse_client_flags(&[0, 0, 0, 3]), Ok(true));
        assert_eq!(
            parse_client_flags(&[0, 0, 0, 4]),
            Err(OptionError::UnknownClientFlags(4))
        );
    }

    #[test]
    fn go_and_info_parse_name_and_requests() {
        let parsed = parse_option(OPT_GO, &info_payload("rbd/vm1", &[3, 1])).unwrap();
        assert_eq!(
            parsed,
            ClientOption::Info {
                go: true,
                name: "rbd/vm1".into(),
                requests: vec![3, 1]
            }
        );
        // A count that does not match the bytes present is invalid, both ways.
        let mut long = info_payload("a", &[3]);
        long.push(0);
        assert!(matches!(
            parse_option(OPT_INFO, &long),
            Err(OptionError::Invalid { .. })
        ));
        let short = &info_payload("a", &[3])[..7];
        assert!(parse_option(OPT_INFO, short).is_err());
    }

    #[test]
    fn names_must_be_utf8_without_nul_and_bounded() {
        assert!(parse_option(OPT_EXPORT_NAME, b"a\0b").is_err());
        assert!(parse_option(OPT_EXPORT_NAME, &[0xff, 0xfe]).is_err());
        assert!(parse_option(OPT_EXPORT_NAME, &vec![b'a'; STRING_BYTES_MAX + 1]).is_err());
        assert_eq!(
            parse_option(OPT_EXPORT_NAME, b"fb/img"),
            Ok(ClientOption::ExportName("fb/img".into()))
        );
        // A name length field far larger than the payload is refused, not trusted.
        let mut p = u32::MAX.to_be_bytes().to_vec();
        p.extend_from_slice(&[0, 0]);
        assert!(parse_option(OPT_GO, &p).is_err());
    }

    #[test]
    fn meta_context_queries_parse_and_select() {
        let parsed = parse_option(
            OPT_SET_META_CONTEXT,
            &meta_payload("fb/img", &["base:allocation"]),
        )
        .unwrap();
        let ClientOption::MetaContext { set, name, queries } = parsed else {
            panic!("not a meta context option");
        };
        assert!(set);
        assert_eq!(name, "fb/img");
        assert_eq!(meta_contexts(true, &queries), vec![META_BASE_ALLOCATION]);
        assert_eq!(meta_contexts(false, &[]), vec![META_BASE_ALLOCATION]);
        assert_eq!(
            meta_contexts(false, &["base:".into()]),
            vec![META_BASE_ALLOCATION]
        );
        assert!(meta_contexts(true, &["base:".into()]).is_empty());
        assert!(meta_contexts(true, &["qemu:dirty-bitmap:x".into()]).is_empty());
        // A query count larger than the bytes could hold is refused before allocating.
        let mut p = meta_payload("x", &[]);
        let at = p.len() - 4;
        p[at..].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse_option(OPT_LIST_META_CONTEXT, &p).is_err());
    }

    #[test]
    fn options_without_payload_refuse_one_and_unknown_options_pass_through() {
        assert_eq!(parse_option(OPT_LIST, &[]), Ok(ClientOption::List));
        assert!(parse_option(OPT_LIST, &[0]).is_err());
        assert_eq!(
            parse_option(OPT_STRUCTURED_REPLY, &[]),
            Ok(ClientOption::StructuredReply)
        );
        assert_eq!(parse_option(99, &[1, 2]), Ok(ClientOption::Unknown(99)));
    }
}
