//! Wake-ups of the MQTT tasks asked for on the thread that drives their runtime, between two of
//! its drives (service/sources.rs: the intake confirms deliveries and queues results outside
//! the runtime, then drives it at its next pump or sleep).
//!
//! A `Notify` woken from outside its current-thread runtime makes tokio write the runtime's
//! eventfd, and the next drive's first look at the sockets returns at once for it: about 1 100
//! writes a second at the gateway rate, for tasks that cannot run before that drive anyway. So
//! such a wake-up waits here and is given when the drive begins, from inside the runtime, where it
//! is a push on the run queue. Anywhere else — another thread, or inside a drive — it is given at
//! once.

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use tokio::sync::Notify;

thread_local! {
    /// This thread drives a runtime of MQTT tasks ([`drives`]).
    static DRIVER: Cell<bool> = const { Cell::new(false) };
    /// A drive is under way on this thread.
    static DRIVING: Cell<bool> = const { Cell::new(false) };
    /// Wake-ups asked for since the last drive, in order.
    static WAITING: RefCell<Vec<Arc<Notify>>> = const { RefCell::new(Vec::new()) };
}

/// The calling thread drives the MQTT tasks' runtime from now on: its wake-ups between drives
/// wait for the next one.
pub fn drives() {
    DRIVER.set(true);
}

/// Wakes `notify`'s task: at once, or at the calling thread's next drive when it drives the
/// tasks and is between drives.
pub fn wake(notify: &Arc<Notify>) {
    if DRIVER.get() && !DRIVING.get() {
        WAITING.with_borrow_mut(|waiting| waiting.push(Arc::clone(notify)));
    } else {
        notify.notify_one();
    }
}

/// A drive of the tasks' runtime under way on this thread: made first thing inside its
/// `block_on`, it gives the wake-ups that waited; until it is dropped, wake-ups are given at once.
pub struct Drive(());

impl Drive {
    pub fn begins() -> Drive {
        // Set first: a wake-up asked for from here on is given at once, never queued behind these.
        DRIVING.set(true);
        // A `notify_one` only schedules the task (nothing runs inside it), and the queue keeps its
        // allocation for the next ones.
        WAITING.with_borrow_mut(|waiting| waiting.drain(..).for_each(|notify| notify.notify_one()));
        Drive(())
    }
}

impl Drop for Drive {
    fn drop(&mut self) {
        DRIVING.set(false);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use tokio::sync::Notify;

    use super::*;

    /// On the driving thread a wake-up between drives waits for the next drive and reaches its
    /// task there; on another thread, or inside a drive, it is given at once.
    #[test]
    fn a_wake_up_between_drives_waits_for_the_next_drive() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let notify = Arc::new(Notify::new());
        let woken = Arc::new(AtomicU32::new(0));
        let (task_notify, task_woken) = (Arc::clone(&notify), Arc::clone(&woken));
        runtime.spawn(async move {
            loop {
                task_notify.notified().await;
                task_woken.fetch_add(1, Ordering::SeqCst);
            }
        });
        let pump = |runtime: &tokio::runtime::Runtime| {
            runtime.block_on(async {
                let _drive = Drive::begins();
                tokio::task::yield_now().await;
            })
        };
        pump(&runtime); // the task waits on its Notify

        // Another thread's wake-up is given at once: a permit the task takes at the next drive.
        let other = Arc::clone(&notify);
        std::thread::spawn(move || wake(&other)).join().unwrap();
        pump(&runtime);
        assert_eq!(woken.load(Ordering::SeqCst), 1);

        drives();
        wake(&notify);
        assert!(WAITING.with_borrow(|waiting| waiting.len() == 1), "it waits for the drive");
        pump(&runtime);
        assert_eq!(woken.load(Ordering::SeqCst), 2, "given at the drive's start, the task ran in it");
        assert!(WAITING.with_borrow(Vec::is_empty));

        // Inside a drive it is given at once.
        runtime.block_on(async {
            let _drive = Drive::begins();
            wake(&notify);
            assert!(WAITING.with_borrow(Vec::is_empty));
            tokio::task::yield_now().await;
        });
        assert_eq!(woken.load(Ordering::SeqCst), 3);
        DRIVER.set(false);
    }
}
