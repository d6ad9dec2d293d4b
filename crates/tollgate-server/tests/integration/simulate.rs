//! `tollgate simulate`: the algorithms' known pictures as golden tables (the fixed window's 2x
//! at a window edge, the sliding log's exactness, the shaper's smooth output), and charts that
//! are real images.

use crate::support;

use support::run;

#[test]
fn a_spike_at_the_window_edge() {
    let (code, out, err) = run(&[
        "simulate",
        "--pattern",
        "edge",
        "--limit",
        "100",
        "--period",
        "1m",
    ]);
    assert_eq!(code, 0, "{err}");
    let golden = "\
| algorithm | offered | admitted | most in any 60 s | vs limit 100 | longest delay |
| --- | ---: | ---: | ---: | ---: | ---: |
| fixed_window | 200 | 200 | 200 | 2.00x | 0.000 s |
| sliding_window | 200 | 101 | 101 | 1.01x | 0.000 s |
| sliding_log | 200 | 100 | 100 | 1.00x | 0.000 s |
| token_bucket | 200 | 103 | 103 | 1.03x | 0.000 s |
| leaky_bucket(shaper) | 200 | 103 | 100 | 1.00x | 59.400 s |
| gcra | 200 | 103 | 103 | 1.03x | 0.000 s |
";
    assert_eq!(out, golden);
}

#[test]
fn uniform_traffic_over_the_limit() {
    let (code, out, err) = run(&[
        "simulate",
        "--pattern",
        "uniform",
        "--rate",
        "5",
        "--limit",
        "100",
        "--period",
        "1m",
        "--duration",
        "2m",
        "--algorithms",
        "fixed_window,sliding_log,sub_windows(6)",
    ]);
    assert_eq!(code, 0, "{err}");
    let golden = "\
| algorithm | offered | admitted | most in any 60 s | vs limit 100 | longest delay |
| --- | ---: | ---: | ---: | ---: | ---: |
| fixed_window | 600 | 200 | 100 | 1.00x | 0.000 s |
| sliding_log | 600 | 200 | 100 | 1.00x | 0.000 s |
| sub_windows(6) | 600 | 200 | 100 | 1.00x | 0.000 s |
";
    assert_eq!(out, golden);
}

#[test]
fn bursts_and_a_replayed_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("times.txt");
    std::fs::write(&file, "# seconds\n0\n0.5\n1\n1.5\n2\n2.5\n3\n").unwrap();
    let pattern = format!("file:{}", file.display());
    let (code, out, err) = run(&[
        "simulate",
        "--pattern",
        &pattern,
        "--limit",
        "2",
        "--period",
        "1s",
        "--duration",
        "10s",
        "--algorithms",
        "fixed_window,gcra",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("| fixed_window | 7 | 7 | 2 | 1.00x | 0.000 s |"),
        "{out}"
    );
    let (code, out, _) = run(&[
        "simulate",
        "--pattern",
        "burst",
        "--limit",
        "10",
        "--period",
        "10s",
        "--duration",
        "30s",
        "--algorithms",
        "sliding_log",
    ]);
    assert_eq!(code, 0);
    assert!(
        out.contains("| sliding_log | 60 | 30 | 10 | 1.00x | 0.000 s |"),
        "{out}"
    );
    let (code, _, err) = run(&["simulate", "--pattern", "file:/nonexistent"]);
    assert_eq!(code, 1);
    assert!(err.contains("cannot read /nonexistent"), "{err}");
    let (code, _, err) = run(&["simulate", "--algorithms", "bogus"]);
    assert_eq!(code, 1);
    assert!(err.contains("unknown algorithm `bogus`"), "{err}");
}

#[test]
fn charts_are_real_images() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["edge.png", "edge.svg"] {
        let path = dir.path().join(name);
        let (code, _, err) = run(&["simulate", "--chart", path.to_str().unwrap()]);
        assert_eq!(code, 0, "{err}");
        let bytes = std::fs::read(&path).unwrap();
        if name.ends_with(".png") {
            let image = image::load_from_memory(&bytes).expect("a PNG that decodes");
            // Six algorithms: three rows of two panels under the title and the key.
            assert_eq!((image.width(), image.height()), (1000, 900));
            // Not blank: the lines drew colours other than the white background.
            let rgb = image.to_rgb8();
            let colours = rgb.pixels().filter(|p| p.0 != [255, 255, 255]).count();
            assert!(colours > 10_000, "{colours}");
        } else {
            let text = String::from_utf8(bytes).unwrap();
            assert!(
                text.starts_with("<svg") && text.contains("<polyline"),
                "{}",
                &text[..200]
            );
            // The title names the pattern and the limit; one panel per algorithm, each with
            // the most it admitted in any window; the key above the panels, not over them.
            assert!(
                text.contains("edge traffic, 200 requests, against 100 per 60s"),
                "{text}"
            );
            let panels = text.matches(": at most ").count();
            assert_eq!(panels, 6, "{text}");
            assert!(text.contains("fixed_window: at most 200 in any 60s"));
            assert!(text.contains("sliding_log: at most 100 in any 60s"));
            assert!(text.contains("the limit of 100 (dashed red)"));
            // The limit's dashes: many short red segments.
            let red = text.matches("#FF0000").count();
            assert!(red >= 6 * 20, "{red} red elements");
        }
    }
    let (code, out, err) = run(&["simulate", "--chart", "/tmp/chart.gif"]);
    assert_eq!(code, 1);
    assert!(err.contains("must be a .png or .svg"), "{err}");
    assert!(out.is_empty(), "said before the run: {out}");
}
