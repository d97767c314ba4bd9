//! Every example configuration in configs/ validates, and replays its sample inputs.
//!
//! Convention: `configs/NAME.toml` with one sample file per input stream in
//! `configs/samples/NAME/STREAM.jsonl`. Each example must produce at least one result from every
//! operator, so an example that silently stopped joining fails here.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn examples() -> Vec<PathBuf> {
    let mut configs: Vec<PathBuf> = std::fs::read_dir("configs")
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    configs.sort();
    configs
}

fn braid(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_braid")).args(args).output().unwrap()
}

#[test]
fn every_example_validates() {
    let configs = examples();
    assert!(!configs.is_empty(), "configs/ holds the examples");
    for config in configs {
        let out = braid(&["validate", "--config", config.to_str().unwrap()]);
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
        let mut args: Vec<String> = vec!["replay".into(), "--config".into(), config.display().to_string()];
        let mut inputs: Vec<PathBuf> = std::fs::read_dir(&samples).unwrap().map(|e| e.unwrap().path()).collect();
        inputs.sort();
        for input in &inputs {
            let stream = input.file_stem().unwrap().to_str().unwrap();
            args.extend(["--input".into(), format!("{stream}={}", input.display())]);
        }
        for op in &plan.operators {
            args.extend(["--output".into(), format!("{}={}", op.name, dir.path().join(&op.name).display())]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = braid(&args);
        assert!(out.status.success(), "{}: {}", config.display(), String::from_utf8_lossy(&out.stderr));
        for op in &plan.operators {
            let results = std::fs::read_to_string(dir.path().join(&op.name)).unwrap();
            assert!(results.lines().count() > 0, "{}: operator {} produced nothing", config.display(), op.name);
        }
    }
}
