//! What a caught panic said: the monitor's supervisor and request guard and the OSD's shard
//! and task watchers all report it in one line.

use std::any::Any;

/// The text of a panic's payload (what `panic!` was given, when it was a string).
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_payloads_panic_gives_read_as_text() {
        let literal = std::panic::catch_unwind(|| panic!("bug")).unwrap_err();
        assert_eq!(panic_message(&*literal), "bug");
        let formatted = std::panic::catch_unwind(|| panic!("bug {}", 7)).unwrap_err();
        assert_eq!(panic_message(&*formatted), "bug 7");
        let other = std::panic::catch_unwind(|| std::panic::panic_any(7u8)).unwrap_err();
        assert_eq!(panic_message(&*other), "a panic with a non-string payload");
    }
}
