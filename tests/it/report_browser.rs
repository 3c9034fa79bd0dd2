//! The HTML report in a real browser: Debian's headless Chromium (installed by
//! scripts/install-chromium.sh, which scripts/test.sh runs) loads the report from a file URL with
//! the network cut off, and the test reads the rendered DOM: one timeline bar per iteration in its
//! story's row with its outcome's class, and the summary's numbers equal to the ledger's. A
//! screenshot is saved under the test's output folder, and Chromium's network log must show no
//! request beyond the file itself.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use crate::common::text;
use crate::morning::history;

/// The browser: `RALPH_CHROMIUM`, else `chromium` on PATH; a missing one fails with the install
/// command (it never skips under CI; locally `RALPH_SKIP_REAL_CLI=1` skips it).
fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("RALPH_CHROMIUM").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(p));
    }
    if let Ok(p) = which::which("chromium") {
        return Some(p);
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    if !ci && std::env::var("RALPH_SKIP_REAL_CLI").is_ok_and(|v| v == "1") {
        eprintln!("skipping the browser test: no chromium, and RALPH_SKIP_REAL_CLI=1");
        return None;
    }
    panic!("the HTML report test needs Chromium: run scripts/install-chromium.sh (apt-get install chromium), or name one with RALPH_CHROMIUM");
}

fn headless(
    browser: &PathBuf,
    profile: &std::path::Path,
    extra: &[String],
    url: &str,
) -> std::process::Output {
    Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-default-apps",
            // No way out: every host name fails to resolve, and any proxied request goes nowhere.
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "--proxy-server=127.0.0.1:9",
            "--window-size=1300,2000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url)
        .output()
        .expect("start chromium")
}

/// The URLs a `file://` page asked for, from Chromium's network log (the browser's own
/// background requests, which carry no page, are not the page's).
fn page_requests(netlog: &std::path::Path) -> Vec<String> {
    let text = std::fs::read_to_string(netlog).unwrap_or_default();
    // A log cut at exit lacks its closing brackets.
    let doc: Value = serde_json::from_str(&text)
        .or_else(|_| serde_json::from_str(&format!("{}]}}", text.trim_end().trim_end_matches(','))))
        .unwrap_or_default();
    let mut urls: Vec<String> = doc["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let p = &e["params"];
            let page = p["network_isolation_key"].as_str()?.contains("file://");
            let url = p["url"].as_str()?;
            (page && !url.starts_with("file://")).then(|| url.to_owned())
        })
        .collect();
    urls.dedup();
    urls
}

#[test]
fn the_report_renders_offline_with_one_bar_per_iteration() {
    let Some(browser) = chromium() else { return };
    let env = history();
    let html = env.root.path().join("report.html");
    let out = env.ralph(&["report", "--all", "--out", html.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let url = format!("file://{}", html.display());
    let profile = env.root.path().join("chromium-profile");
    let netlog = env.root.path().join("netlog.json");
    let shown = headless(
        &browser,
        &profile,
        &[
            "--dump-dom".into(),
            format!("--log-net-log={}", netlog.display()),
        ],
        &url,
    );
    assert_eq!(shown.status.code(), Some(0), "{}", text(&shown));
    let dom = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(
        dom.contains("<section id=\"timeline-section\">"),
        "not rendered:\n{dom}"
    );

    // One bar per ledger record, in its story's row, with its outcome's class.
    let ledger: Vec<Value> = env
        .read(".ralph/ledger.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let row_re =
        regex::Regex::new(r#"<div class="trow" data-story="([^"]+)">(.*?)</div></div>"#).unwrap();
    let bar_re = regex::Regex::new(
        r#"<div class="bar outcome-([a-z_]+)" data-iteration="(\d+)" data-outcome="([a-z_]+)""#,
    )
    .unwrap();
    let mut bars = std::collections::BTreeMap::new();
    for row in row_re.captures_iter(&dom) {
        for bar in bar_re.captures_iter(&row[2]) {
            assert_eq!(&bar[1], &bar[3], "class and outcome differ");
            bars.insert(
                bar[2].parse::<u64>().unwrap(),
                (row[1].to_string(), bar[1].to_string()),
            );
        }
    }
    assert_eq!(bars.len(), ledger.len(), "bars: {bars:?}");
    for r in &ledger {
        let n = r["iteration"].as_u64().unwrap();
        assert_eq!(
            bars.get(&n),
            Some(&(
                r["story_id"].as_str().unwrap().to_owned(),
                r["outcome"].as_str().unwrap().to_owned()
            )),
            "iteration {n}"
        );
    }
    // The wait after the usage limit shows as a band.
    assert!(
        dom.contains("band wait-usage_limit"),
        "no usage-limit wait band"
    );

    // The summary's numbers are the ledger's.
    let num = |id: &str| -> String {
        let re = regex::Regex::new(&format!(r#"id="{id}">([^<]*)<"#)).unwrap();
        re.captures(&dom)
            .map(|c| c[1].to_string())
            .unwrap_or_default()
    };
    assert_eq!(num("sum-iterations"), ledger.len().to_string());
    let cost: f64 = ledger.iter().filter_map(|r| r["cost_usd"].as_f64()).sum();
    assert_eq!(num("sum-cost"), format!("${cost:.2}"));
    assert_eq!(num("sum-passed"), "2");
    assert_eq!(num("sum-stories"), "5");
    assert_eq!(num("sum-blocked"), "1");

    // Nothing but the file itself was requested by the page.
    let requested = page_requests(&netlog);
    assert!(
        requested.is_empty(),
        "the report made requests: {requested:?}"
    );
    // The check itself sees a page that does make one.
    let probe = env.root.path().join("probe.html");
    std::fs::write(
        &probe,
        "<html><body><img src=\"http://example.com/x.png\"></body></html>",
    )
    .unwrap();
    let probe_log = env.root.path().join("probe-netlog.json");
    headless(
        &browser,
        &profile,
        &[
            "--dump-dom".into(),
            format!("--log-net-log={}", probe_log.display()),
        ],
        &format!("file://{}", probe.display()),
    );
    assert_eq!(page_requests(&probe_log), ["http://example.com/x.png"]);

    // A screenshot, to look at.
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("report");
    std::fs::create_dir_all(&dir).unwrap();
    let png = dir.join("report.png");
    let shot = headless(
        &browser,
        &profile,
        &[format!("--screenshot={}", png.display())],
        &url,
    );
    assert_eq!(shot.status.code(), Some(0), "{}", text(&shot));
    let bytes = std::fs::read(&png).unwrap();
    assert!(
        bytes.starts_with(b"\x89PNG") && bytes.len() > 20_000,
        "screenshot of {} bytes",
        bytes.len()
    );
    eprintln!("report screenshot: {}", png.display());
}
