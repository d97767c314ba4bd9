//! The feeder: the calling thread's side that puts work into the shards' rings — rows routed by
//! key hash (broadcast rows to all), the ticks its [`TickPlanner`](crate::time::TickPlanner)
//! decides to run, processing time, progress and the end of input. A full ring is backpressure:
//! the feeder drains results while it waits for room.

use std::sync::Arc;

use crate::record::view::{KeyRef, RowView};
use crate::ring::{FrameKind, PushError};

use super::wake::{Doorbell, NUDGE_AFTER};
use super::wire::TickEvent;
use super::{Emit, Runtime, RuntimeError};

impl Runtime {
    /// Runs the ticks in (now, to] that can change anything; processing time moves to `to`.
    pub fn advance_to(&mut self, to: i128, emit: &mut impl Emit) -> Result<(), RuntimeError> {
        while let Some(t) = self.planner.next_tick(to) {
            let tick = self.planner.tick(t);
            self.seq += 1;
            let event = TickEvent { seq: self.seq, tick };
            self.writer.tick(&event);
            self.send_written(None, FrameKind::Tick, emit)?;
            self.unpublished += 1;
            if self.publication.at_tick(self.unpublished) {
                self.publish(emit)?;
            }
        }
        if self.planner.move_to(to) && self.clocked {
            self.seq += 1;
            self.writer.event(self.seq, Some(to));
            self.send_written(None, FrameKind::ProcessingTime, emit)?;
        }
        Ok(())
    }

    /// Braid was down until `now` (the service starts, from a checkpoint and its journal, or
    /// after a stall): operators' `ttl` clocks do not count the gap. Journaled, so a restart
    /// replays the same clocks.
    pub fn downtime_ends(&mut self, now: i128, emit: &mut impl Emit) -> Result<(), RuntimeError> {
        if self.clocked {
            self.seq += 1;
            self.writer.downtime_ends(self.seq, now);
            self.send_written(None, FrameKind::ProcessingTime, emit)?;
        }
        Ok(())
    }

    /// Ingests one decoded row of stream `stream` that arrived at `arrival`. A row larger than
    /// the rings carry is [`RuntimeError::RowTooLarge`], returned before anything happened (not
    /// counted, no watermark moved): the caller dead-letters it and goes on.
    pub fn ingest<'r>(
        &mut self,
        stream: usize,
        row: impl Into<RowView<'r>>,
        arrival: i128,
        emit: &mut impl Emit,
    ) -> Result<(), RuntimeError> {
        let row = row.into();
        let seq = self.seq + 1;
        self.writer.row_event(seq, stream, row).map_err(|e| RuntimeError::Frame(e.to_string()))?;
        if self.writer.row_len > self.max_row {
            return Err(RuntimeError::RowTooLarge { bytes: self.writer.row_len, max: self.max_row });
        }
        self.seq = seq;
        self.stream_counters[stream].rows += 1;
        self.planner.on_row(stream, row.ts(), arrival);
        let shard = (row.key() != KeyRef::Broadcast).then(|| (row.key_hash() % self.shards as u64) as usize);
        if let Some(shard) = shard {
            self.hot_keys[shard].count(row);
        }
        self.send_written(shard, FrameKind::Row, emit)?;
        self.unpublished += 1;
        if self.publication.after_row(self.unpublished) {
            self.publish(emit)?;
        }
        Ok(())
    }

    /// `braid run`: the input of `streams` cannot reach braid (their source is disconnected):
    /// they do not turn idle until [`resume_streams`](Self::resume_streams).
    pub fn suspend_streams(&mut self, streams: &[usize]) {
        self.planner.suspend(streams);
    }

    /// The input of `streams` reaches braid again at processing time `now` (call before
    /// `advance_to(now)`): idleness counts from `now`.
    pub fn resume_streams(&mut self, streams: &[usize], now: i128) {
        self.planner.resume(streams, now);
    }

    /// The watermark of stream `stream` as of the last tick that ran.
    pub fn stream_watermark(&self, stream: usize) -> crate::time::Time {
        self.planner.stream_watermark(stream)
    }

    /// A line of stream `stream` went to `dead_letter`.
    pub fn count_dead_letter(&mut self, stream: usize, reason: &str) {
        let counters = &mut self.stream_counters[stream];
        counters.rows += 1;
        *counters.dead_letters.entry(reason.to_owned()).or_default() += 1;
    }

    /// The feeder's doorbell: a live source rings it after handing over a message, so a feeder
    /// waiting in [`wait`](Self::wait) wakes for input as it does for results.
    pub fn doorbell(&self) -> Arc<Doorbell> {
        Arc::clone(&self.bell)
    }

    /// The calling thread sleeps through a driver from now on, running other work of its own
    /// while it waits for the shards and for input ([`SleepDriver`](super::wake::SleepDriver)).
    pub fn sleep_with(
        &mut self,
        make: impl FnOnce(std::os::unix::net::UnixStream) -> std::io::Result<Box<dyn super::wake::SleepDriver>>,
    ) -> std::io::Result<()> {
        self.sleeper.drive_with(make)
    }

    /// Publishes every frame ingested so far to the shards (a live feeder calls this after each
    /// batch: its rows are then in the shards' rings) and drains results.
    pub fn flush(&mut self, emit: &mut impl Emit) -> Result<(), RuntimeError> {
        self.publish(emit)
    }

    /// Sends the frame just written into `self.writer` to `shard`, or to every shard.
    pub(super) fn send_written(
        &mut self,
        shard: Option<usize>,
        kind: FrameKind,
        emit: &mut impl Emit,
    ) -> Result<(), RuntimeError> {
        // Lent out while `send` (which needs `&mut self`) pushes it; no copy.
        let payload = std::mem::take(&mut self.writer.buf);
        let shards = shard.map_or(0..self.shards, |s| s..s + 1);
        let sent = shards.into_iter().try_for_each(|s| self.send(s, kind, &payload, emit));
        self.writer.buf = payload;
        sent
    }

    /// Pushes a frame to a shard, waiting (and draining results) while its ring is full.
    fn send(
        &mut self,
        shard: usize,
        kind: FrameKind,
        payload: &[u8],
        emit: &mut impl Emit,
    ) -> Result<(), RuntimeError> {
        loop {
            match self.feeds[shard].ring.push(kind, payload) {
                Ok(()) => return Ok(()),
                Err(PushError::TooLarge) => return Err(RuntimeError::TooLarge(payload.len())),
                Err(PushError::NoSpace(errno)) => {
                    return Err(RuntimeError::RingSpace(std::io::Error::from_raw_os_error(errno)));
                }
                Err(PushError::Full) => {}
            }
            self.publish_rings();
            self.release();
            if self.collect(emit) {
                continue;
            }
            let released = self.feeds[shard].ring.released();
            let (feed, results) = (&self.feeds[shard].ring, &self.results);
            if self.bell.spin(|| feed.released() != released || results.iter().any(|r| r.ring.has_frames())) {
                continue;
            }
            // The shard rings back when it releases space (the ring's "room wanted").
            self.feeds[shard].ring.want_room();
            self.bell.prepare_sleep();
            if self.collect(emit) {
                self.bell.awake();
                continue;
            }
            if self.feeds[shard].ring.push(kind, payload).is_ok() {
                self.bell.awake();
                return Ok(());
            }
            if let Some(lost) = self.lost_shard() {
                return Err(lost);
            }
            if !self.bell.wait_blocking(&mut self.sleeper, NUDGE_AFTER) {
                self.nudge_shards();
            }
        }
    }

    /// Publishes the frames pushed so far (with the feeder's progress when operators are
    /// chained, so their shards can move on) and drains results.
    pub(super) fn publish(&mut self, emit: &mut impl Emit) -> Result<(), RuntimeError> {
        self.unpublished = 0;
        if self.chained {
            self.writer.event(self.seq, None);
            self.send_written(None, FrameKind::Progress, emit)?;
        }
        self.publish_rings();
        self.collect(emit);
        Ok(())
    }

    fn publish_rings(&mut self) {
        for feed in &mut self.feeds {
            if feed.ring.commit() {
                feed.bell.ring();
            }
        }
    }
}
