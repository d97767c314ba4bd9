//! Every example configuration in configs/ validates, and replays its sample inputs.
//!
//! Convention: `configs/NAME.toml` with one sample file per input stream in
//! `configs/samples/NAME/STREAM.jsonl`. Each example must produce at least one result from every
//! operator, so an example that silently stopped joining fails here.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::{Path, PathBuf};

use common::run::{braid, read_jsonl, replay_command};

fn examples() -> Vec<PathBuf> {
    let mut configs: Vec<PathBuf> = std::fs::read_dir("configs")
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    configs.sort();
    configs
}

#[test]
fn every_example_validates() {
    let configs = examples();
    assert!(!configs.is_empty(), "configs/ holds the examples");
    for config in configs {
        let out = braid().args(["validate", "--config", config.to_str().unwrap()]).output().unwrap();
        assert!(out.status.success(), "{}: {}", config.display(), String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn every_example_replays_its_samples_with_results_from_every_operator() {
    for config in examples() {
        let name = config.file_stem().unwrap().to_str().unwrap();
        let samples = Path::new("configs/samples").join(name);
        assert!(samples.is_dir(), "{}: sample inputs belong in {}", config.display(), samples.display());
        let plan = braid::config::load(&config).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut files: Vec<PathBuf> = std::fs::read_dir(&samples).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        let inputs: Vec<(String, PathBuf)> =
            files.into_iter().map(|input| (input.file_stem().unwrap().to_str().unwrap().to_owned(), input)).collect();
        let outputs: Vec<(String, PathBuf)> =
            plan.operators.iter().map(|op| (op.name.clone(), dir.path().join(&op.name))).collect();
        let out = replay_command(&config, None, &inputs, &outputs).output().unwrap();
        assert!(out.status.success(), "{}: {}", config.display(), String::from_utf8_lossy(&out.stderr));
        for (op, path) in &outputs {
            let results = read_jsonl(path).unwrap();
            assert!(!results.is_empty(), "{}: operator {op} produced nothing", config.display());
        }
    }
}
