use super::*;

fn shard_file(epoch: u64, shard: u32, shards: u32) -> ShardFile {
    let operators = vec![OperatorSnapshot {
        name: "effect".into(),
        definition: 7,
        state: vec![epoch as u8; 40],
        earlier: Vec::new(),
    }];
    ShardFile { epoch, shard, shards, operators }
}

/// What a shard and the checkpoint writer do.
fn write_shard(dir: &CheckpointDir, file: &ShardFile) {
    let (path, bytes) = dir.shard_file(file).unwrap();
    write_file(&path, &bytes, dir.syncs()).unwrap();
}

fn commit(dir: &CheckpointDir, epoch: u64, shards: u32) {
    for shard in 0..shards {
        write_shard(dir, &shard_file(epoch, shard, shards));
    }
    let manifest = Manifest { epoch, shards, feeder: vec![1, 2], driver: vec![epoch as u8], chain_from: epoch };
    dir.commit(&manifest).unwrap();
}

/// Checkpoint `epoch` of one shard whose operator `effect` wrote `state`, a delta of its
/// snapshot in `base` (0: whole), committed with `chain_from`.
fn commit_chained(dir: &CheckpointDir, epoch: u64, base: u64, chain_from: u64) {
    let mut buffer = CheckpointDir::shard_buffer();
    let level = buffer.append(&[epoch as u8; 24]).unwrap();
    let operators = vec![SnapshotEntry::new("effect".into(), 7, level, base)];
    let (path, bytes) = dir.shard_file_in(&ShardIndex { epoch, shard: 0, shards: 1, operators }, buffer).unwrap();
    write_file(&path, &bytes, false).unwrap();
    let manifest = Manifest { epoch, shards: 1, feeder: Vec::new(), driver: Vec::new(), chain_from };
    dir.commit(&manifest).unwrap();
}

/// A delta reads back with the snapshots it applies to, whole first; a commit keeps every
/// checkpoint the newest and the previous one's chains reach, and no more.
#[test]
fn a_chain_reads_back_to_its_whole_snapshot_and_is_kept_while_reached() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CheckpointDir::new(tmp.path().join("checkpoints"), false);
    commit_chained(&dir, 1, 0, 1);
    commit_chained(&dir, 2, 1, 1);
    commit_chained(&dir, 3, 2, 1);
    assert_eq!(dir.epochs(), vec![1, 2, 3]);
    let loaded = dir.latest().unwrap();
    let effect = &loaded.shards[0].operators[0];
    assert_eq!(effect.chain(), [&[1u8; 24][..], &[2; 24], &[3; 24]]);
    commit_chained(&dir, 4, 0, 4);
    assert_eq!(dir.epochs(), vec![1, 2, 3, 4], "the previous one's chain stays, for a fallback");
    assert_eq!(dir.latest().unwrap().shards[0].operators[0].chain(), [&[4u8; 24][..]]);
    commit_chained(&dir, 5, 4, 4);
    assert_eq!(dir.epochs(), vec![1, 2, 3, 4, 5], "3 with its chain is the fallback of 4's chain");
    commit_chained(&dir, 6, 0, 6);
    assert_eq!(dir.epochs(), vec![4, 5, 6]);
    commit_chained(&dir, 7, 6, 6);

    // A damaged whole snapshot fails the deltas of it: the start falls back past them, to the
    // newest checkpoint before the chain, whose files are its own.
    let path = dir.shard_path(6, 0);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[HEADER] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    let loaded = dir.latest().unwrap();
    assert_eq!(loaded.manifest.epoch, 5, "7 is a delta of 6, and 6 is damaged");
    assert_eq!(loaded.shards[0].operators[0].chain(), [&[4u8; 24][..], &[5; 24]]);
}

/// A delta whose base does not hold its operator, or names a later checkpoint, is refused.
#[test]
fn a_delta_without_its_base_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CheckpointDir::new(tmp.path().join("checkpoints"), false);
    commit_chained(&dir, 1, 0, 1);
    commit_chained(&dir, 2, 3, 1);
    assert_eq!(dir.latest().unwrap().manifest.epoch, 1, "a delta of a later checkpoint");
    commit_chained(&dir, 3, 2, 1);
    assert_eq!(dir.latest().unwrap().manifest.epoch, 1, "its base was set aside");
}

/// Which base the next checkpoint gets: the last one once committed, for at most
/// `MAX_DELTAS` deltas in a row; none after one that was not committed.
#[test]
fn a_chain_grows_from_committed_checkpoints_and_is_cut_after_max_deltas() {
    let mut chain = Chain::default();
    assert_eq!(chain.begin(1), 0, "the first is whole");
    assert_eq!(chain.chain_from(1), 1);
    chain.committed(1);
    for epoch in 2..=MAX_DELTAS + 1 {
        assert_eq!(chain.begin(epoch), epoch - 1);
        assert_eq!(chain.chain_from(epoch), 1);
        chain.committed(epoch);
    }
    let next = MAX_DELTAS + 2;
    assert_eq!(chain.begin(next), 0, "whole again after {MAX_DELTAS} deltas");
    chain.committed(next);
    assert_eq!(chain.begin(next + 1), next);
    // Not committed: the next one is whole.
    assert_eq!(chain.begin(next + 2), 0);
    assert_eq!(chain.chain_from(next + 2), next + 2);

    // As many deltas as the journal's retention covers with their fallback.
    let deltas = |retention, interval| Chain::within_retention(retention, interval).max_deltas;
    assert_eq!(deltas(600_000, 1_000), MAX_DELTAS);
    assert_eq!((deltas(2_000, 500), deltas(3_000, 1_000), deltas(1_000, 1_000), deltas(1_000, 0)), (1, 0, 0, 0));
    let mut short = Chain::within_retention(3_000, 1_000);
    assert_eq!(short.begin(1), 0);
    short.committed(1);
    assert_eq!(short.begin(2), 0, "no deltas: every checkpoint whole");
}

/// A checkpoint of version 5 (no bases, no `chain_from`) reads as one of whole snapshots.
#[test]
fn a_version_5_checkpoint_is_read() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CheckpointDir::new(tmp.path().join("checkpoints"), false);
    std::fs::create_dir_all(dir.epoch_dir(1)).unwrap();
    let mut buffer = CheckpointDir::shard_buffer();
    let level = buffer.append(&[5; 24]).unwrap();
    let entry =
        v5::SnapshotEntry { name: "effect".into(), definition: 7, start: (level.start - HEADER) as u64, len: 24 };
    let index = v5::ShardIndex { epoch: 1, shard: 0, shards: 1, operators: vec![entry] };
    let mut shard = framed_in(SHARD_MAGIC, &index, buffer).unwrap();
    shard[8..12].copy_from_slice(&5u32.to_le_bytes());
    std::fs::write(dir.shard_path(1, 0), &shard).unwrap();
    let manifest = v5::Manifest { epoch: 1, shards: 1, feeder: vec![1], driver: vec![2] };
    let mut manifest = framed_in(MANIFEST_MAGIC, &manifest, SnapshotBuffer::with_header(HEADER)).unwrap();
    manifest[8..12].copy_from_slice(&5u32.to_le_bytes());
    std::fs::write(dir.epoch_dir(1).join("manifest"), &manifest).unwrap();
    let loaded = dir.latest().unwrap();
    assert_eq!((loaded.manifest.chain_from, &loaded.manifest.driver[..]), (1, &[2u8][..]));
    assert_eq!(loaded.shards[0].operators[0].chain(), [&[5u8; 24][..]]);
}

#[test]
fn the_newest_committed_checkpoint_wins_and_two_are_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CheckpointDir::new(tmp.path().join("checkpoints"), true);
    assert!(dir.latest().is_none());
    for epoch in 1..=3 {
        commit(&dir, epoch, 2);
    }
    // Shard files of an epoch whose manifest was never written (a crash before the commit).
    write_shard(&dir, &shard_file(4, 0, 2));
    let loaded = dir.latest().unwrap();
    assert_eq!(loaded.manifest.epoch, 3);
    assert_eq!(loaded.manifest.driver, vec![3]);
    assert_eq!(loaded.shards.len(), 2);
    assert_eq!(loaded.shards[1].operators[0].state, vec![3; 40]);
    assert_eq!(dir.epochs(), vec![2, 3, 4], "epoch 1 deleted, 2 kept as the fallback");
    dir.clear();
    assert!(dir.epochs().is_empty());
}

/// A checkpoint written by the previous version (a shard file that is one archive holding copies
/// of its snapshots) is read after an upgrade, so the state it holds is not lost.
#[test]
fn a_version_4_shard_file_is_read() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CheckpointDir::new(tmp.path().join("checkpoints"), false);
    commit(&dir, 1, 1);
    let file = shard_file(1, 0, 1);
    let mut old = framed_in(SHARD_MAGIC, &file, SnapshotBuffer::with_header(HEADER)).unwrap();
    old[8..12].copy_from_slice(&4u32.to_le_bytes());
    std::fs::write(dir.shard_path(1, 0), &old).unwrap();
    let loaded = dir.latest().unwrap();
    assert_eq!(loaded.shards[0].operators[0].state, file.operators[0].state);
    assert_eq!(loaded.shards[0].operators[0].name, "effect");

    old[8..12].copy_from_slice(&3u32.to_le_bytes());
    std::fs::write(dir.shard_path(1, 0), &old).unwrap();
    assert!(dir.latest().is_none(), "version 3 is not read");
}

#[test]
fn a_damaged_checkpoint_is_set_aside_for_the_previous_one() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("braid.lock"), b"").unwrap(); // the state directory
    let dir = CheckpointDir::new(tmp.path().join("checkpoints"), false);
    commit(&dir, 1, 1);
    commit(&dir, 2, 1);
    let path = dir.shard_path(2, 0);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    std::fs::write(dir.epoch_dir(2).join("taken.log"), [0u8; 8]).unwrap();
    assert_eq!(dir.latest().unwrap().manifest.epoch, 1, "a crc failure is never read");
    let mut quarantined: Vec<String> = std::fs::read_dir(tmp.path().join("quarantine"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().split_once('.').unwrap().1.to_owned())
        .collect();
    quarantined.sort();
    assert_eq!(
        quarantined,
        ["checkpoints.00000000000000000002.manifest", "checkpoints.00000000000000000002.shard-0.snap"]
    );
    assert!(dir.epoch_dir(2).join("taken.log").exists(), "the rows taken since stay known");
    assert_eq!(dir.latest().unwrap().manifest.epoch, 1, "and the next start goes straight to it");
    std::fs::write(dir.epoch_dir(1).join("manifest"), b"braidckp\x09\0\0\0").unwrap();
    assert!(dir.latest().is_none(), "a torn manifest is never read");
}

#[test]
fn another_format_version_is_refused_with_a_message() {
    let payload = b"payload".to_vec();
    let mut bytes = framed_in(MANIFEST_MAGIC, &payload, SnapshotBuffer::with_header(HEADER)).unwrap();
    assert_eq!(unframed(MANIFEST_MAGIC, &bytes, Path::new("m")).unwrap().1.len(), bytes.len() - HEADER);
    bytes[8] = 99;
    let error = unframed(MANIFEST_MAGIC, &bytes, Path::new("m")).unwrap_err().to_string();
    assert!(error.contains("format version 99"), "{error}");
    assert!(
        unframed(
            SHARD_MAGIC,
            &framed_in(MANIFEST_MAGIC, &payload, SnapshotBuffer::with_header(HEADER)).unwrap(),
            Path::new("m")
        )
        .is_err()
    );
}
