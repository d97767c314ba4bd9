//! Where braid's log events go, and in which format (README.md "Logs").
//!
//! - `BRAID_LOG_FORMAT` unset: journald when stderr is connected to the journal, else text on
//!   stderr. systemd sets `JOURNAL_STREAM=DEVICE:INODE` for a service whose stdout or stderr goes
//!   to the journal; the variable is inherited by children whose stderr may point elsewhere, so
//!   it only counts when it names stderr's own device and inode (systemd.exec(5), "Environment
//!   Variables Set or Propagated by the Service Manager"). If the journal socket cannot be
//!   opened, text on stderr, and one warning saying so.
//! - `text`: text on stderr (the default outside systemd); `json`: one JSON object a line on
//!   stderr (`timestamp`, `level`, `target`, `fields` with `message` and the event's fields,
//!   `span`/`spans` when inside one).
//! - Anything else is a configuration error: braid exits 78 (EX_CONFIG) naming the accepted
//!   values, before doing anything, so that a typo in the unit's `Environment=` fails the start
//!   visibly instead of silently logging in a format no collector expects.
//!
//! `BRAID_LOG` is the filter in every format (default `info,rumqttd=off`).

use std::ffi::OsStr;
use std::io::IsTerminal;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The variable choosing the format.
pub const FORMAT_VAR: &str = "BRAID_LOG_FORMAT";
/// The values `BRAID_LOG_FORMAT` accepts.
pub const ACCEPTED: &str = "text, json";
/// rumqttd logs routine disconnects as errors (braid::broker::TRACING_DIRECTIVE); BRAID_LOG overrides.
const DEFAULT_FILTER: &str = "info,rumqttd=off";

/// Where log events go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Human-readable lines on stderr.
    Text,
    /// One JSON object a line on stderr.
    Json,
    /// journald's native protocol, fields kept (falls back to [`Output::Text`] without a socket).
    Journald,
}

/// `BRAID_LOG_FORMAT` has a value braid does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{FORMAT_VAR}={value:?} is not a log format; accepted: {ACCEPTED} (unset: journald under systemd, else text)")]
pub struct UnknownFormat {
    /// The value found, lossily decoded.
    pub value: String,
}

/// The output for `format` (`BRAID_LOG_FORMAT`), `journal_stream` (`JOURNAL_STREAM`) and
/// stderr's `(device, inode)`, if known. Pure, so that the choice is tested without a journal.
pub fn select(
    format: Option<&OsStr>,
    journal_stream: Option<&OsStr>,
    stderr_id: Option<(u64, u64)>,
) -> Result<Output, UnknownFormat> {
    match format.map(|f| f.to_str()) {
        Some(Some("text")) => Ok(Output::Text),
        Some(Some("json")) => Ok(Output::Json),
        Some(Some("")) | None => {
            let connected = stderr_id.is_some() && journal_stream.and_then(parse_journal_stream) == stderr_id;
            Ok(if connected { Output::Journald } else { Output::Text })
        }
        Some(_) => Err(UnknownFormat { value: format.unwrap_or_default().to_string_lossy().into_owned() }),
    }
}

/// `DEVICE:INODE`, both decimal, as systemd writes `JOURNAL_STREAM`.
fn parse_journal_stream(value: &OsStr) -> Option<(u64, u64)> {
    let (device, inode) = value.to_str()?.split_once(':')?;
    Some((device.parse().ok()?, inode.parse().ok()?))
}

/// stderr's device and inode, if it is open.
fn stderr_id() -> Option<(u64, u64)> {
    let fd = std::io::stderr().as_fd().try_clone_to_owned().ok()?;
    let metadata = std::fs::File::from(fd).metadata().ok()?;
    Some((metadata.dev(), metadata.ino()))
}

/// Installs the global subscriber chosen from the environment; returns the output in use.
pub fn init() -> Result<Output, UnknownFormat> {
    let output =
        select(std::env::var_os(FORMAT_VAR).as_deref(), std::env::var_os("JOURNAL_STREAM").as_deref(), stderr_id())?;
    let filter = EnvFilter::try_from_env("BRAID_LOG").unwrap_or_else(|_| DEFAULT_FILTER.into());
    let text =
        || tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(std::io::stderr().is_terminal());
    match output {
        Output::Text => tracing_subscriber::registry().with(filter).with(text()).init(),
        Output::Json => tracing_subscriber::registry()
            .with(filter)
            .with(tracing_subscriber::fmt::layer().json().with_writer(std::io::stderr))
            .init(),
        Output::Journald => match tracing_journald::layer() {
            Ok(journald) => tracing_subscriber::registry().with(filter).with(journald).init(),
            Err(error) => {
                tracing_subscriber::registry().with(filter).with(text()).init();
                tracing::warn!(%error, "Journald socket unavailable, logging text to stderr");
                return Ok(Output::Text);
            }
        },
    }
    Ok(output)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(s: &str) -> Option<&OsStr> {
        Some(OsStr::new(s))
    }

    #[test]
    fn unset_format_is_text_outside_systemd() {
        assert_eq!(select(None, None, Some((1, 2))), Ok(Output::Text));
        assert_eq!(select(os(""), None, Some((1, 2))), Ok(Output::Text));
    }

    #[test]
    fn journald_only_when_journal_stream_names_stderr() {
        assert_eq!(select(None, os("1:2"), Some((1, 2))), Ok(Output::Journald));
        // Inherited by a child whose stderr was redirected: another inode, or another device.
        assert_eq!(select(None, os("1:3"), Some((1, 2))), Ok(Output::Text));
        assert_eq!(select(None, os("9:2"), Some((1, 2))), Ok(Output::Text));
        // stderr closed or not a file we can stat.
        assert_eq!(select(None, os("1:2"), None), Ok(Output::Text));
    }

    #[test]
    fn malformed_journal_stream_is_text() {
        for value in ["", "1", "1:", ":2", "a:b", "1:2:3", "-1:2", "1:2 "] {
            assert_eq!(select(None, os(value), Some((1, 2))), Ok(Output::Text), "{value:?}");
        }
    }

    #[test]
    fn an_explicit_format_wins_over_the_journal() {
        assert_eq!(select(os("json"), os("1:2"), Some((1, 2))), Ok(Output::Json));
        assert_eq!(select(os("text"), os("1:2"), Some((1, 2))), Ok(Output::Text));
    }

    #[test]
    fn unknown_format_names_the_accepted_values() {
        let error = select(os("JSON"), None, None).expect_err("case matters");
        assert_eq!(error.value, "JSON");
        assert_eq!(
            error.to_string(),
            "BRAID_LOG_FORMAT=\"JSON\" is not a log format; accepted: text, json (unset: journald under systemd, else text)"
        );
        assert!(select(os("journald"), None, None).is_err());
    }

    #[test]
    fn stderr_of_the_test_process_can_be_identified() {
        // Whatever stderr is here (a pipe, a file, a terminal), it has a device and an inode.
        assert!(stderr_id().is_some());
    }
}
