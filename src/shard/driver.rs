//! The monoio runtime a shard runs on: io_uring when the kernel allows it, else the legacy
//! (epoll) driver (DESIGN.md "Hard facts").
//!
//! monoio's `FusionDriver` probes io_uring (`utils::detect_uring`, which honours
//! `MONOIO_FORCE_LEGACY_DRIVER=1`) and builds the matching runtime; when the probe passes but the
//! ring still cannot be created (RLIMIT_MEMLOCK, seccomp, a container), the legacy runtime is
//! built instead. The driver that runs is logged and reported ([`Driver`]).

use std::future::Future;

use monoio::{FusionDriver, FusionRuntime, IoUringDriver, LegacyDriver, RuntimeBuilder};

/// Which monoio driver a shard runs on (the `driver` label of `braid_shard_driver`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Driver {
    IoUring,
    Legacy,
}

impl Driver {
    pub fn as_str(self) -> &'static str {
        match self {
            Driver::IoUring => "io_uring",
            Driver::Legacy => "legacy",
        }
    }
}

pub struct MonoioRuntime {
    runtime: FusionRuntime<IoUringDriver, LegacyDriver>,
}

impl MonoioRuntime {
    pub fn build() -> std::io::Result<MonoioRuntime> {
        let runtime = match RuntimeBuilder::<FusionDriver>::new().build() {
            Ok(runtime) => runtime,
            Err(error) => {
                tracing::warn!(%error, "io_uring runtime could not be built; using the legacy driver");
                RuntimeBuilder::<LegacyDriver>::new().build()?.into()
            }
        };
        Ok(MonoioRuntime { runtime })
    }

    pub fn driver(&self) -> Driver {
        match self.runtime {
            FusionRuntime::Uring(_) => Driver::IoUring,
            FusionRuntime::Legacy(_) => Driver::Legacy,
        }
    }

    pub fn block_on<F: Future>(&mut self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }
}
