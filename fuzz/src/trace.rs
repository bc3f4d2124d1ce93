//! A capture's trace file: accepted or refused, never a panic; an accepted one keeps the
//! format's invariants and is written back byte for byte.

/// A capture's trace file as outside input (`NAME.trace` beside a corpus, which `ztier
/// replay` reads). By the first byte: the rest is the whole file; or epochs after a valid
/// header; or a valid trace built from the input (pages appearing, changing and going over
/// a few dozen page numbers, so that the same page comes back), written out, then changed at
/// places the input names, by XOR or by an edge number written over the bytes there (no
/// change: it must read back as built).
///
/// A file is accepted or refused, never a panic; an accepted trace keeps the format's
/// invariants, checked here against a model of the pages present, and is written back byte
/// for byte.
pub fn trace(data: &[u8]) {
    use ztier_corpus::trace::Trace;
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let header: Vec<u8> = [
        &b"ZTIERTRC"[..],
        &1u32.to_le_bytes(),
        &4096u32.to_le_bytes(),
    ]
    .concat();
    let (file, built) = match mode % 4 {
        0 => (rest.to_vec(), None),
        1 => ([&header[..], rest].concat(), None),
        edges => {
            let (built, changes) = build_trace(rest);
            let mut file = built.to_bytes().expect("a built trace's lists fit");
            for change in changes.chunks_exact(3) {
                let at = usize::from(u16::from_le_bytes([change[0], change[1]])) % file.len();
                if edges == 2 {
                    file[at] ^= change[2];
                } else {
                    // An edge number written over the bytes there (8 of them, or its low 4).
                    let n = TRACE_EDGES[usize::from(change[2]) % TRACE_EDGES.len()];
                    let width = if change[2] & 0x80 == 0 { 8 } else { 4 };
                    let end = (at + width).min(file.len());
                    file[at..end].copy_from_slice(&n.to_le_bytes()[..end - at]);
                }
            }
            let unchanged = changes.len() < 3;
            (file, unchanged.then_some(built))
        }
    };
    let Ok(trace) = Trace::from_bytes(&file) else {
        assert!(built.is_none(), "a trace as built is refused");
        return;
    };
    if let Some(built) = built {
        assert_eq!(trace, built, "read back other than built");
    }
    assert_eq!(
        trace.check_invariants(),
        Ok(()),
        "read, yet its check refuses it"
    );
    assert_eq!(
        trace.to_bytes().expect("an accepted trace's lists fit"),
        file,
        "written back other than read"
    );
    check_trace(&trace);
}

/// Numbers at the edges of a trace's fields (counts, page numbers, times).
const TRACE_EDGES: [u64; 10] = [
    0,
    1,
    2,
    u32::MAX as u64 - 1,
    u32::MAX as u64,
    u32::MAX as u64 + 1,
    1 << 63,
    u64::MAX - 2,
    u64::MAX - 1,
    u64::MAX,
];

/// The format's invariants, from a model of the pages present: a page appears only when
/// absent, changes or goes only when present, is named once an epoch; corpus pages run
/// 0, 1, 2, ... in order; times do not go backwards; the unchanged count adds up.
fn check_trace(trace: &ztier_corpus::trace::Trace) {
    assert_eq!(trace.page_size, 4096, "the corpus's page size");
    let mut present = std::collections::HashSet::new();
    let mut next_corpus_page = 0u64;
    let mut millis = 0;
    for e in &trace.epochs {
        assert!(e.millis >= millis, "time went backwards");
        millis = e.millis;
        let mut named = std::collections::HashSet::new();
        for w in &e.appeared {
            assert!(present.insert(w.vpn), "{:#x} appeared while present", w.vpn);
        }
        for w in &e.changed {
            assert!(
                present.contains(&w.vpn),
                "{:#x} changed while absent",
                w.vpn
            );
        }
        for w in e.appeared.iter().chain(&e.changed) {
            assert!(named.insert(w.vpn), "{:#x} named twice", w.vpn);
            assert_eq!(
                u64::from(w.corpus_page),
                next_corpus_page,
                "corpus pages out of order"
            );
            next_corpus_page += 1;
        }
        for vpn in &e.went {
            assert!(named.insert(*vpn), "{vpn:#x} named twice");
            assert!(present.remove(vpn), "{vpn:#x} went while absent");
        }
        assert_eq!(
            e.present(),
            present.len() as u64,
            "the counts do not add up"
        );
    }
    assert_eq!(
        trace.corpus_pages(),
        next_corpus_page,
        "corpus pages miscounted"
    );
}

/// A valid trace from `data`, and the bytes left over (the changes to make to its file).
/// Each epoch takes a byte of time step and a byte of how many operations follow; each
/// operation a byte: the low six bits a page number, the top bit what happens to it if it
/// is present (changes or goes; an absent one appears; a page already named this epoch is
/// passed over).
fn build_trace(mut data: &[u8]) -> (ztier_corpus::trace::Trace, &[u8]) {
    use ztier_corpus::trace::{Epoch, PageWrite, Trace};
    let mut present = std::collections::BTreeSet::new();
    let mut epochs = Vec::new();
    let mut corpus_page = 0u32;
    let mut millis = 0u64;
    while let [step, ops, more @ ..] = data {
        if epochs.len() == 8 {
            break;
        }
        let ops = usize::from(*ops % 32).min(more.len());
        let (these, rest) = more.split_at(ops);
        data = rest;
        millis += u64::from(*step);
        let mut e = Epoch {
            millis,
            ..Epoch::default()
        };
        let mut named = std::collections::HashSet::new();
        for &op in these {
            let vpn = u64::from(op & 63) * 0x1000 + 0x7f00_0000;
            if !named.insert(vpn) {
                continue;
            }
            let write = PageWrite {
                vpn,
                corpus_page: 0,
            };
            match (present.contains(&vpn), op >> 7) {
                (false, _) => e.appeared.push(write),
                (true, 0) => e.changed.push(write),
                (true, _) => e.went.push(vpn),
            }
        }
        for w in e.appeared.iter_mut().chain(e.changed.iter_mut()) {
            w.corpus_page = corpus_page;
            corpus_page += 1;
        }
        for w in &e.appeared {
            present.insert(w.vpn);
        }
        for vpn in &e.went {
            present.remove(vpn);
        }
        e.unchanged = present.len() as u64 - (e.appeared.len() + e.changed.len()) as u64;
        epochs.push(e);
    }
    let trace = Trace {
        page_size: 4096,
        epochs,
    };
    (trace, data)
}
