use super::*;

fn plan() -> crate::plan::Plan {
    crate::config::parse(
        "t.toml",
        "[streams.s]\nkey = \"k\"\ntime = { field = \"ts\", unit = \"ms\" }\nmax_payload = \"2KiB\"\n\
         fields = { k = \"string\", ts = \"int\" }\n\
         [streams.t]\nkey = \"k\"\nfields = { k = \"string\" }\n",
    )
    .unwrap()
}

/// A file of every kind of line, its arrivals out of order when `shuffled`.
fn text(seed: u64, lines: usize, shuffled: bool) -> String {
    let mut x = seed;
    let mut out = String::new();
    for i in 0..lines {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let r = (x >> 33) as usize;
        let ts = if shuffled { (r % 5000) as i64 } else { i as i64 * 3 };
        out += &match r % 13 {
            0 => "\n".to_owned(),
            1 => format!("{{\"k\":\"d{i}\",\"ts\":{ts}}}\r\n"),
            2 => "not json\n".to_owned(),
            3 => format!("{{\"k\":\"d{i}\",\"ts\":{},\"arrival\":{ts}}}\n", ts - 5),
            4 => format!("{{\"k\":\"{}\",\"ts\":{ts}}}\n", "x".repeat(1500 + r % 5000)),
            5 => format!("{{\"k\":\"{}\",\"ts\":{ts}}}\r\n", "y".repeat(2030 + r % 40)),
            6 => "  \t \r\n".to_owned(),
            7 => format!("{{\"k\":5,\"ts\":{ts}}}\n"),
            _ => format!("{{\"k\":\"d{i}\",\"ts\":{ts}}}\n"),
        };
    }
    out += &format!("{{\"k\":\"last\",\"ts\":{}}}", if shuffled { 1 } else { lines * 3 });
    out
}

/// What the merge must give, computed the simple way: every file whole in memory, decoded,
/// arrivals filled from neighbours, all lines sorted.
fn reference(files: &[(usize, &[u8])], plan: &crate::plan::Plan) -> Vec<String> {
    let mut all = Vec::new();
    for (flag, &(stream, bytes)) in files.iter().enumerate() {
        let def = &plan.streams[stream];
        let mut lines = Vec::new();
        for (line_no, line) in bytes.split(|&b| b == b'\n').enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let decoded = decode_line(&def.schema, line, def.max_payload);
            let content = match decoded.outcome {
                Ok(fields) => Content::Row(fields),
                Err(reason) => Content::DeadLetter(reason),
            };
            lines.push((decoded.arrival, line_no, line, content));
        }
        let mut previous = None;
        for l in lines.iter_mut() {
            l.0 = l.0.or(previous);
            previous = l.0;
        }
        let mut next = None;
        for l in lines.iter_mut().rev() {
            l.0 = l.0.or(next);
            next = l.0;
        }
        for (arrival, line_no, line, content) in lines {
            let raw = match content {
                Content::DeadLetter(reason) => dead_letter_raw(line, reason).into_owned(),
                Content::Row(_) => String::new(),
            };
            all.push(((arrival.unwrap_or(0), flag, line_no), format!("{stream} {content:?} {raw}")));
        }
    }
    all.sort_by_key(|a| a.0);
    all.into_iter().map(|(k, s)| format!("{k:?} {s}")).collect()
}

fn merged(paths: &[(usize, &Path)], plan: &crate::plan::Plan, run_bytes: usize) -> Vec<String> {
    merged_in(paths, plan, run_bytes, Order::Scan).unwrap()
}

/// The merge of `paths` opened with `order`; `OutOfOrder` as soon as it shows.
fn merged_in(
    paths: &[(usize, &Path)],
    plan: &crate::plan::Plan,
    run_bytes: usize,
    order: Order,
) -> Result<Vec<String>, InputError> {
    let spill = tempfile::tempdir().unwrap();
    let mut inputs = Inputs::open(paths, &plan.streams, spill.path(), run_bytes, order)?;
    let first = inputs.peek_arrival()?;
    let mut out = Vec::new();
    while let Some(line) = inputs.next()? {
        let raw = match line.content {
            Content::DeadLetter(reason) => line.raw(reason).into_owned(),
            Content::Row(_) => String::new(),
        };
        let key = (line.arrival, line.flag, line.line_no);
        out.push(format!("{key:?} {} {:?} {raw}", line.stream, line.content));
    }
    assert_eq!(first, out.first().map(|l| l[1..l.find(',').unwrap()].parse().unwrap()));
    // The spill file is unlinked: nothing is left in the directory.
    assert_eq!(std::fs::read_dir(spill.path()).unwrap().count(), 0);
    Ok(out)
}

#[test]
fn streamed_merge_matches_sorting_everything_in_memory() {
    let plan = plan();
    let dir = tempfile::tempdir().unwrap();
    let texts = [
        (0, text(1, 3000, true)),
        (1, "{\"k\":\"a\"}\n".repeat(3)),
        (0, text(2, 2000, false)),
        (0, String::new()),
        (0, text(3, 500, true)),
    ];
    let paths: Vec<(usize, PathBuf)> = texts
        .iter()
        .enumerate()
        .map(|(i, (stream, t))| {
            let path = dir.path().join(format!("{i}.jsonl"));
            std::fs::write(&path, t).unwrap();
            (*stream, path)
        })
        .collect();
    let files: Vec<(usize, &[u8])> = texts.iter().map(|(s, t)| (*s, t.as_bytes())).collect();
    let paths: Vec<(usize, &Path)> = paths.iter().map(|(s, p)| (*s, p.as_path())).collect();
    let expected = reference(&files, &plan);
    assert!(expected.len() > 4000);
    // One run per file, and runs of a few lines each (hundreds of runs).
    assert_eq!(merged(&paths, &plan, SORT_RUN_BYTES), expected);
    assert_eq!(merged(&paths, &plan, 300), expected);
}

#[test]
fn a_pipe_is_read_as_its_text_would_be() {
    let plan = plan();
    let dir = tempfile::tempdir().unwrap();
    let (file, fifo) = (dir.path().join("file.jsonl"), dir.path().join("fifo"));
    let text = text(6, 2000, true);
    std::fs::write(&file, &text).unwrap();
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let writer = {
        let (fifo, text) = (fifo.clone(), text.clone());
        std::thread::spawn(move || std::fs::write(fifo, text).unwrap())
    };
    let from_pipe = merged(&[(0, fifo.as_path())], &plan, 300);
    writer.join().unwrap();
    assert_eq!(from_pipe, merged(&[(0, file.as_path())], &plan, 300));
}

#[test]
fn the_first_pass_in_chunks_equals_one_pass() {
    let plan = plan();
    let dir = tempfile::tempdir().unwrap();
    for (seed, shuffled) in [(4, true), (5, false)] {
        let path = dir.path().join(format!("{seed}.jsonl"));
        std::fs::write(&path, text(seed, 2000, shuffled)).unwrap();
        let whole = scan(&path, &plan.streams[0], u64::MAX).unwrap();
        assert_eq!(whole.ordered, !shuffled);
        for chunk in [97, 4096, 65536] {
            assert_eq!(scan(&path, &plan.streams[0], chunk).unwrap(), whole, "chunk {chunk}");
        }
    }
}

/// Taken on trust, files in order merge as the first pass merges them; a file out of order stops
/// the merge at its first line below the one before it, whichever line that is.
#[test]
fn order_taken_on_trust_merges_alike_and_stops_at_the_first_line_out_of_order() {
    let plan = plan();
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    // Dead letters, blank and oversized lines, lines before the first arrival: all in order.
    let in_order = [
        write("a.jsonl", &format!("not json\n\n{}", text(2, 2000, false))),
        write("b.jsonl", &"{\"k\":\"a\"}\n".repeat(3)),
        write("c.jsonl", ""),
    ];
    let paths: Vec<(usize, &Path)> = vec![(0, &in_order[0]), (1, &in_order[1]), (0, &in_order[2])];
    let scanned = merged(&paths, &plan, SORT_RUN_BYTES);
    assert_eq!(merged_in(&paths, &plan, SORT_RUN_BYTES, Order::Trust).unwrap(), scanned);

    // Equal arrivals are in order; one below the line before it is not, even as the last line.
    let ties = write("ties.jsonl", "{\"k\":\"a\",\"ts\":5}\nnot json\n{\"k\":\"b\",\"ts\":5}\n");
    assert!(merged_in(&[(0, &ties)], &plan, SORT_RUN_BYTES, Order::Trust).is_ok());
    let ordered = text(5, 500, false);
    let late_last = write("last.jsonl", &format!("{ordered}\n{{\"k\":\"z\",\"ts\":0}}\n"));
    let shuffled = write("shuffled.jsonl", &text(4, 500, true));
    for (flag, path) in [(1, &late_last), (1, &shuffled)] {
        match merged_in(&[(0, &in_order[0]), (0, path)], &plan, SORT_RUN_BYTES, Order::Trust) {
            Err(InputError::OutOfOrder(f)) => assert_eq!(f, flag),
            other => panic!("{}: expected OutOfOrder, got {:?}", path.display(), other.map(|o| o.len())),
        }
    }
}
