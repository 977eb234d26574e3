//! The properties the fuzz target (`fuzz/fuzz_targets/nbd_parse.rs`) and the stable property
//! test (`tests/no_panic.rs`) check on arbitrary bytes: the option and request parsers never
//! panic, and what they accept respects the protocol's bounds.
//!
//! The first byte of the input picks the parser; the rest is its input.

use crate::consts::*;
use crate::extents::{allocation_descriptors, zero_runs};
use crate::option::{meta_contexts, parse_client_flags, parse_option, ClientOption, OptionHeader};
use crate::request::{Command, Negotiated, RequestHeader};

/// Runs one input through the parser its first byte selects; panics if a property fails.
pub fn check(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    match selector % 4 {
        0 => check_handshake(rest),
        1 => check_option(rest),
        2 => check_request(rest),
        _ => check_extents(rest),
    }
}

fn array<const N: usize>(bytes: &[u8]) -> Option<[u8; N]> {
    bytes.get(..N)?.try_into().ok()
}

/// Client flags and option headers: accepted ones have only known bits / the right magic.
fn check_handshake(bytes: &[u8]) {
    if let Some(flags) = array::<4>(bytes) {
        let only_known_bits = flags[..3] == [0, 0, 0] && flags[3] & !3 == 0;
        assert_eq!(parse_client_flags(&flags).is_ok(), only_known_bits);
    }
    if let Some(header) = array::<OPTION_HEADER_BYTES>(bytes) {
        // `IHAVEOPT` in network byte order is its ASCII text.
        assert_eq!(
            OptionHeader::parse(&header).is_ok(),
            &header[..8] == b"IHAVEOPT"
        );
    }
}

/// Option payloads: whatever parses respects the string bound, and counts match the bytes.
fn check_option(bytes: &[u8]) {
    let Some(code) = array::<2>(bytes) else {
        return;
    };
    // Options 0..=15 cover every known one and a few unknown ones.
    let option = u32::from(code[0] % 16);
    let payload = &bytes[2..];
    match parse_option(option, payload) {
        Ok(ClientOption::ExportName(name)) => assert!(name.len() <= STRING_BYTES_MAX),
        Ok(ClientOption::Info { name, requests, .. }) => {
            assert!(name.len() <= STRING_BYTES_MAX);
            assert_eq!(4 + name.len() + 2 + 2 * requests.len(), payload.len());
        }
        Ok(ClientOption::MetaContext { set, name, queries }) => {
            assert!(name.len() <= STRING_BYTES_MAX);
            let bytes: usize = queries.iter().map(|q| 4 + q.len()).sum();
            assert_eq!(4 + name.len() + 4 + bytes, payload.len());
            assert!(meta_contexts(set, &queries).len() <= 1);
        }
        Ok(
            ClientOption::Abort
            | ClientOption::List
            | ClientOption::StartTls
            | ClientOption::StructuredReply,
        ) => assert!(payload.is_empty()),
        Ok(ClientOption::Unknown(o)) => assert_eq!(o, option),
        Err(_) => {}
    }
}

/// Request headers under every negotiation: an accepted command stays inside the export and
/// the payload limit, and carries only flags valid for it.
fn check_request(bytes: &[u8]) {
    let Some(raw) = array::<REQUEST_HEADER_BYTES>(bytes) else {
        return;
    };
    let knobs = bytes.get(REQUEST_HEADER_BYTES).copied().unwrap_or(0);
    let negotiated = Negotiated {
        size_bytes: u64::from(knobs >> 2) << 20,
        structured: knobs & 1 != 0,
        allocation_context: knobs & 2 != 0,
    };
    let Ok(header) = RequestHeader::parse(&raw) else {
        return;
    };
    let inside = |offset: u64, length: u32| {
        assert!(offset + u64::from(length) <= negotiated.size_bytes);
    };
    match header.validate(&negotiated) {
        Ok(Command::Read { offset, length, df }) => {
            inside(offset, length);
            assert!(length <= PAYLOAD_BYTES_MAX);
            assert!(!df || negotiated.structured);
        }
        Ok(Command::Write { offset, length }) => {
            inside(offset, length);
            assert!(length <= PAYLOAD_BYTES_MAX);
            assert_eq!(header.payload_bytes(), length);
        }
        Ok(Command::Trim { offset, length } | Command::Cache { offset, length }) => {
            inside(offset, length)
        }
        Ok(Command::WriteZeroes { offset, length, .. }) => inside(offset, length),
        Ok(Command::BlockStatus { offset, length, .. }) => {
            inside(offset, length);
            assert!(negotiated.allocation_context && length > 0);
        }
        Ok(Command::Flush) => assert!(header.offset == 0 && header.length == 0),
        Ok(Command::Disconnect) => assert_eq!(header.kind, CMD_DISC),
        Err(rejection) => assert_ne!(rejection.error, 0),
    }
}

/// Zero runs cover read data exactly; descriptors from sorted ranges cover the window.
fn check_extents(bytes: &[u8]) {
    let offset = u64::from(bytes.first().copied().unwrap_or(0)) * 512;
    let data = bytes.get(1..).unwrap_or(&[]);
    let runs = zero_runs(offset, data);
    assert_eq!(runs.iter().map(|r| r.len).sum::<usize>(), data.len());
    // Ranges from the input bytes, made sorted and disjoint inside a 64 KiB window.
    let window = 64u32 << 10;
    let mut ranges = Vec::new();
    let mut at = offset;
    for pair in data.chunks(2) {
        let gap = u64::from(pair[0]) * 64;
        let len = u64::from(*pair.get(1).unwrap_or(&1)).max(1) * 64;
        if at + gap + len > offset + u64::from(window) {
            break;
        }
        ranges.push((at + gap, len));
        at += gap + len;
    }
    let descriptors = allocation_descriptors(offset, window, &ranges, false);
    let total: u64 = descriptors.iter().map(|d| u64::from(d.0)).sum();
    assert_eq!(total, u64::from(window));
    assert!(descriptors.iter().all(|d| d.0 > 0));
}
