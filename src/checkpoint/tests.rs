use super::*;

fn shard_file(epoch: u64, shard: u32, shards: u32) -> ShardFile {
    let operators = vec![OperatorSnapshot { name: "effect".into(), definition: 7, state: vec![epoch as u8; 40] }];
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
    let manifest = Manifest { epoch, shards, feeder: vec![1, 2], driver: vec![epoch as u8] };
    dir.commit(&manifest).unwrap();
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
