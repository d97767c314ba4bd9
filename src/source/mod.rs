//! Sources: where rows enter braid. [`route`] maps an MQTT topic to the streams whose `topic`
//! filter it matches and the fields their `+name` levels capture.
//!
//! A source's network side (the MQTT client, a task the intake thread drives while it waits:
//! service/sources.rs) hands each received message to the
//! service's feeder as a [`Delivery`] over a bounded channel, numbered in receive order. The
//! feeder journals it and puts its row into the shard's ring, then confirms its number through
//! [`Confirmations`]; only then does the source send the PUBACK (at-least-once: a crash never
//! loses an acknowledged message). A full channel is backpressure: the source keeps polling (the
//! connection stays alive) but stops acknowledging, so the broker stops sending.

pub mod mqtt;
pub mod relay;
pub mod route;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use crate::config::StreamDef;
use crate::record::Row;
use crate::record::decode::{Fields, Reason, check_time_window, dead_letter_raw};
use crate::record::input::InputRows;
use crate::record::view::{RowView, ValueRef};
use crate::shard::{Emit, Runtime, RuntimeError};

/// One message received by source `source`.
#[derive(Clone, Debug)]
pub struct Delivery {
    /// The source's index in `Plan::sources`.
    pub source: usize,
    /// Receive order within the source, from 1, never reused (also not across reconnects).
    pub seq: u64,
    pub topic: String,
    pub payload: Bytes,
    /// Processing time of its arrival, ms since the Unix epoch.
    pub arrival: i128,
    /// The broker sent it before (MQTT's DUP flag): braid may already hold it in its journal.
    pub redelivered: bool,
}

/// Per source: the highest [`Delivery::seq`] whose row is safely in braid (journaled and in its
/// shard's ring), and a wake-up for the source's task. Written by the feeder, read by the sources.
///
/// The source is woken only once [`ACK_WAKE_AFTER`] deliveries wait to be acked. Fewer go out
/// with the source's next round: the next read from the broker (soon, while messages flow), or
/// its retry timer (`source::mqtt::HANDOFF_RETRY`) at the latest. A wake-up per confirmation was
/// a second wake-up of the network thread per read from the broker (the sources ran on the io
/// thread then), and an eventfd write by the feeder (BENCHMARKS.md "Fewer wake-ups per MQTT message").
#[derive(Debug)]
pub struct Confirmations {
    confirmed: Vec<AtomicU64>,
    /// Per source: the highest delivery it has acked.
    acked: Vec<AtomicU64>,
    wake: Vec<Arc<tokio::sync::Notify>>,
}

/// Confirmed deliveries waiting for their acks that wake their source. Well under a broker's
/// in-flight window (mosquitto: 20 by default), which would otherwise stop sending and wait for
/// the retry timer.
pub const ACK_WAKE_AFTER: u64 = 8;

impl Confirmations {
    pub fn new(sources: usize) -> Arc<Confirmations> {
        Arc::new(Confirmations {
            confirmed: (0..sources).map(|_| AtomicU64::new(0)).collect(),
            acked: (0..sources).map(|_| AtomicU64::new(0)).collect(),
            wake: (0..sources).map(|_| Arc::new(tokio::sync::Notify::new())).collect(),
        })
    }

    /// Every delivery of `source` up to `seq` is safe (the feeder calls this).
    pub fn confirm(&self, source: usize, seq: u64) {
        let before = self.confirmed[source].fetch_max(seq, Ordering::AcqRel);
        if before < seq && seq.saturating_sub(self.acked[source].load(Ordering::Acquire)) >= ACK_WAKE_AFTER {
            crate::mqtt::wake::wake(&self.wake[source]);
        }
    }

    /// `source` has acked every delivery up to `seq` (the source calls this).
    pub fn acked(&self, source: usize, seq: u64) {
        self.acked[source].fetch_max(seq, Ordering::AcqRel);
    }

    /// The highest confirmed delivery of `source`.
    pub fn confirmed(&self, source: usize) -> u64 {
        self.confirmed[source].load(Ordering::Acquire)
    }

    /// Woken after a confirmation of `source` (a source task awaits `notified()`).
    pub fn waker(&self, source: usize) -> Arc<tokio::sync::Notify> {
        Arc::clone(&self.wake[source])
    }
}

/// A line or payload of an input stream as decoded, at the processing time it arrived.
pub struct Arrived<'a> {
    pub stream: usize,
    /// The text it was decoded from.
    pub line: &'a [u8],
    pub decoded: Result<&'a Fields, Reason>,
    pub arrival: i64,
}

/// Ingests `input`, of stream `def`: the one path of an input into the runtime, for `braid
/// replay` and `braid run`. Its event time must lie in the stream's window around its arrival (an
/// ingest-time stream takes the arrival), and its row must fit the rings; then the runtime takes
/// it, read straight from the line ([`InputRow`]), and `ingested` sees it. Otherwise it is a
/// dead letter: counted under its reason's label, and `dead_lettered` gets the label and the
/// raw text its `dead_letter` row carries.
///
/// [`InputRow`]: crate::record::input::InputRow
pub fn ingest<E: Emit>(
    runtime: &mut Runtime,
    def: &StreamDef,
    input: Arrived<'_>,
    rows: &mut InputRows,
    emit: &mut E,
    ingested: impl FnOnce(&mut E, RowView<'_>, &Runtime),
    dead_lettered: impl FnOnce(&mut E, &str, &str),
) -> Result<(), RuntimeError> {
    let Arrived { stream, line, decoded, arrival } = input;
    let refused = match admit(def, decoded, arrival) {
        Err(reason) => reason,
        Ok((fields, ts)) => {
            let row = rows.row(def, &fields.values, ts, line);
            // A row too large for the rings is refused before anything happened: a dead letter too.
            match runtime.ingest(stream, &row, i128::from(arrival), emit) {
                Ok(()) => {
                    ingested(emit, RowView::Input(&row), runtime);
                    return Ok(());
                }
                Err(RuntimeError::RowTooLarge { .. }) => Reason::TooLarge,
                Err(error) => return Err(error),
            }
        }
    };
    let label = refused.label(&def.schema);
    runtime.count_dead_letter(stream, &label);
    dead_lettered(emit, &label, &dead_letter_raw(line, refused));
    Ok(())
}

/// The decoded fields and event time of an input whose event time lies in its stream's window.
fn admit<'a>(def: &StreamDef, decoded: Result<&'a Fields, Reason>, arrival: i64) -> Result<(&'a Fields, i64), Reason> {
    let fields = decoded?;
    let ts = fields.ts.unwrap_or(arrival);
    check_time_window(ts, arrival, def.max_age, def.max_skew)?;
    Ok((fields, ts))
}

/// The row of a decoded line or payload of stream `def`: its key (broadcast when the stream has
/// none or the value is no key), its stable id (CONTRACT.md rule 10: stream name and declared
/// values in field-name order) and its event time `ts`.
pub fn row_of(def: &StreamDef, values: Vec<crate::record::Value>, ts: i64, rows: &mut InputRows) -> Row {
    let (key, key_hash, id) = rows.identify(def, |pos| values.get(pos).map_or(ValueRef::Null, ValueRef::of));
    let key = key.to_key();
    Row { ts, key_hash, key, id, values: values.into() }
}

/// The sending end of the intake channel: hands deliveries to the feeder and rings its doorbell
/// once they are all in, so a feeder asleep between ticks takes them at once, and in one round.
#[derive(Clone)]
pub struct Intake {
    tx: crossbeam_channel::Sender<Delivery>,
    bell: Arc<crate::shard::wake::Doorbell>,
}

impl Intake {
    pub fn new(tx: crossbeam_channel::Sender<Delivery>, bell: Arc<crate::shard::wake::Doorbell>) -> Intake {
        Intake { tx, bell }
    }

    /// Hands `delivery` over, or gives it back when the channel is full (backpressure) or the
    /// feeder is gone. The feeder is woken by [`ring`](Self::ring), after the batch.
    pub fn try_send(&self, delivery: Delivery) -> Result<(), crossbeam_channel::TrySendError<Delivery>> {
        self.tx.try_send(delivery)
    }

    /// Wakes the feeder if it sleeps (call after a batch of [`try_send`](Self::try_send)s).
    pub fn ring(&self) {
        self.bell.ring();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{ACK_WAKE_AFTER, Confirmations};

    /// Whether the source's wake-up is pending (a stored permit completes at the first poll).
    async fn woken(confirmations: &Confirmations) -> bool {
        tokio::time::timeout(Duration::ZERO, confirmations.waker(0).notified()).await.is_ok()
    }

    #[tokio::test]
    async fn a_source_is_woken_once_enough_confirmed_deliveries_wait_for_acks() {
        let confirmations = Confirmations::new(1);
        confirmations.confirm(0, ACK_WAKE_AFTER - 1);
        assert!(!woken(&confirmations).await, "fewer wait: they go with the source's next round");
        confirmations.confirm(0, ACK_WAKE_AFTER);
        assert!(woken(&confirmations).await);
        confirmations.acked(0, ACK_WAKE_AFTER);
        confirmations.confirm(0, 2 * ACK_WAKE_AFTER - 1);
        assert!(!woken(&confirmations).await, "counted from the last ack");
        confirmations.confirm(0, 2 * ACK_WAKE_AFTER);
        assert!(woken(&confirmations).await);
        assert_eq!(confirmations.confirmed(0), 2 * ACK_WAKE_AFTER);
    }
}
