//! An output file written by a thread of its own.
//!
//! Replay's calling thread decodes every input line, feeds the shards and formats every result:
//! it is the busy one (BENCHMARKS.md). Handing the formatted lines to the kernel (`write`, the
//! copy into the page cache, ext4's block allocation) cost it about a seventh of its time, and
//! none of that needs to be on it. So lines are gathered in chunks of [`CHUNK`] bytes, and a
//! writer thread per file writes each chunk while the calling thread goes on; written chunks
//! come back to be filled again, so the steady state allocates nothing. At most [`IN_FLIGHT`]
//! chunks wait: memory stays bounded, and a slow disk holds the replay back instead of growing it.
//!
//! [`flush`](FileWriter::flush) waits until every byte given so far is written (and synced,
//! when asked): a checkpoint names a file's length only then. The first write error is kept and
//! returned by every later call; bytes after it are not written.

use std::fs::File;
use std::io::{self, Write};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, bounded};

/// Bytes gathered before a chunk goes to the writer thread.
pub const CHUNK: usize = 256 << 10;
/// Chunks handed over and not yet written back.
const IN_FLIGHT: usize = 4;

enum Order {
    Write(Vec<u8>),
    /// Everything before is written; sync the file's data first when `true`; answer.
    Flush(bool, Sender<io::Result<()>>),
}

pub struct FileWriter {
    chunk: Vec<u8>,
    orders: Option<Sender<Order>>,
    /// Written chunks, emptied, to be filled again.
    empties: Receiver<Vec<u8>>,
    thread: Option<JoinHandle<io::Result<()>>>,
    /// Chunks made so far (at most [`IN_FLIGHT`] + 1).
    made: usize,
}

impl FileWriter {
    pub fn new(file: File) -> io::Result<FileWriter> {
        let (orders, inbox) = bounded::<Order>(IN_FLIGHT);
        let (give_back, empties) = bounded::<Vec<u8>>(IN_FLIGHT + 1);
        let thread = std::thread::Builder::new()
            .name("braid-output".into())
            .spawn(move || write_orders(file, &inbox, &give_back))?;
        Ok(FileWriter {
            chunk: Vec::with_capacity(CHUNK),
            orders: Some(orders),
            empties,
            thread: Some(thread),
            made: 1,
        })
    }

    /// Writes every byte given so far to the file (syncing its data when `sync`), or returns the
    /// first error the writer met.
    pub fn flush_and_sync(&mut self, sync: bool) -> io::Result<()> {
        self.hand_over()?;
        let (answer, answered) = bounded(1);
        self.send(Order::Flush(sync, answer))?;
        answered.recv().map_err(|_| self.failure())?
    }

    /// Hands the gathered bytes to the writer thread and takes an empty chunk.
    fn hand_over(&mut self) -> io::Result<()> {
        if self.chunk.is_empty() {
            return Ok(());
        }
        let next = match self.empties.try_recv() {
            Ok(empty) => empty,
            Err(_) if self.made <= IN_FLIGHT => {
                self.made += 1;
                Vec::with_capacity(CHUNK)
            }
            // Every chunk is in flight: wait for the writer to give one back.
            Err(_) => self.empties.recv().map_err(|_| self.failure())?,
        };
        let full = std::mem::replace(&mut self.chunk, next);
        self.send(Order::Write(full))
    }

    fn send(&mut self, order: Order) -> io::Result<()> {
        let sent = self.orders.as_ref().map(|orders| orders.send(order).is_ok());
        if sent == Some(true) { Ok(()) } else { Err(self.failure()) }
    }

    /// The writer thread stopped: its error (it stops only at one, or at a panic).
    fn failure(&mut self) -> io::Error {
        self.orders = None;
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(Err(error))) => error,
            _ => io::Error::other("the output writer thread stopped"),
        }
    }
}

impl Write for FileWriter {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.write_all(bytes)?;
        Ok(bytes.len())
    }

    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.chunk.extend_from_slice(bytes);
        if self.chunk.len() >= CHUNK { self.hand_over() } else { Ok(()) }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.flush_and_sync(false)
    }
}

impl Drop for FileWriter {
    /// Writes what is left, best effort (a caller that needs the error calls `flush` first).
    fn drop(&mut self) {
        let _ = self.hand_over();
        self.orders = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The writer thread: writes each chunk and gives it back emptied; stops at the first error
/// (returned by `join`) or when the orders end.
fn write_orders(mut file: File, orders: &Receiver<Order>, give_back: &Sender<Vec<u8>>) -> io::Result<()> {
    for order in orders {
        match order {
            Order::Write(mut chunk) => {
                file.write_all(&chunk)?;
                chunk.clear();
                // The owner may have gone (dropped): the chunk is then freed here.
                let _ = give_back.try_send(chunk);
            }
            Order::Flush(sync, answer) => {
                let synced = if sync { file.sync_data() } else { Ok(()) };
                let failed = synced.as_ref().err().map(|e| io::Error::new(e.kind(), e.to_string()));
                let _ = answer.send(synced);
                if let Some(error) = failed {
                    return Err(error);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    #[test]
    fn writes_every_byte_in_order_through_many_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let mut writer = FileWriter::new(File::create(&path).unwrap()).unwrap();
        let mut expected = Vec::new();
        for i in 0..200_000u32 {
            let line = format!("{{\"n\":{i}}}\n");
            writer.write_all(line.as_bytes()).unwrap();
            expected.extend_from_slice(line.as_bytes());
            if i == 100_000 {
                writer.flush_and_sync(true).unwrap();
                assert_eq!(std::fs::metadata(&path).unwrap().len(), expected.len() as u64, "flushed: all on file");
            }
        }
        assert!(expected.len() > 4 * CHUNK, "more chunks than may be in flight");
        writer.flush().unwrap();
        drop(writer);
        let mut got = Vec::new();
        File::open(&path).unwrap().read_to_end(&mut got).unwrap();
        assert!(got == expected);
    }

    #[test]
    fn a_write_error_is_returned_not_lost() {
        // /dev/full: every write fails with ENOSPC.
        let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
            panic!("/dev/full is missing");
        };
        let mut writer = FileWriter::new(full).unwrap();
        let line = [b'x'; 1000];
        let mut failed = None;
        for _ in 0..(CHUNK * (IN_FLIGHT + 3)) / line.len() {
            if let Err(error) = writer.write_all(&line) {
                failed = Some(error);
                break;
            }
        }
        let error = failed.unwrap_or_else(|| writer.flush().unwrap_err());
        assert_eq!(error.raw_os_error(), Some(28), "ENOSPC: {error}");
        assert!(writer.flush().is_err(), "and stays failed");
    }
}
