//! `metalctl bulk` and `metalctl batch`: a verb over many nodes under the
//! destructive-batch quorum. `bulk <verb>` submits the request and prints
//! the digest and the exact message approvers sign; `batch approve`
//! rebuilds the batch's Merkle root from its leaves and its digest from
//! its header before it signs (an approver signs what they checked, never
//! a digest the server merely states); `bulk watch` shows a live progress
//! bar and ends with a per-state summary.

use anyhow::{bail, Context as _};
use bcm_contracts::batch::BatchHeader;
use comfy_table::{presets::UTF8_BORDERS_ONLY, Table};
use serde_json::{json, Value};
use std::path::Path;

use crate::{emit, Api, Output};

/// Reads node ids from a file: one per line (blank lines and `#` comments
/// skipped), or a JSON array of strings.
pub fn node_ids(path: &Path) -> anyhow::Result<Vec<String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    if text.trim_start().starts_with('[') {
        return serde_json::from_str(&text)
            .with_context(|| format!("{} is not a JSON array of node ids", path.display()));
    }
    Ok(text
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect())
}

fn counts_line(c: &Value) -> String {
    [
        "queued",
        "started",
        "succeeded",
        "failed",
        "refused",
        "cancelled",
    ]
    .iter()
    .map(|k| format!("{k} {}", c[*k].as_u64().unwrap_or(0)))
    .collect::<Vec<_>>()
    .join(" · ")
}

/// A batch as a table a person reads.
fn batch_table(b: &Value) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY);
    let h = &b["header"];
    let s = |v: &Value| v.as_str().unwrap_or("").to_owned();
    let expires = h["expiresAt"]
        .as_i64()
        .and_then(|e| chrono::DateTime::from_timestamp(e, 0))
        .map(|d| d.to_rfc3339())
        .unwrap_or_default();
    let approvals = b["approvals"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x["approverId"].as_str())
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    for (k, v) in [
        ("BATCH", s(&h["batchId"])),
        ("STATE", s(&b["state"])),
        (
            "VERB",
            match h["wipe"].as_str() {
                Some(w) => format!("{} (wipe {w})", s(&h["operation"])),
                None => s(&h["operation"]),
            },
        ),
        ("POOL", format!("{}/{}", s(&h["tenantId"]), s(&h["poolId"]))),
        ("REASON", s(&b["reason"])),
        ("REQUESTED BY", s(&b["requestedBy"])),
        ("NODES", h["leafCount"].to_string()),
        ("EXPIRES", expires),
        (
            "APPROVALS",
            format!("{approvals} (needs {})", b["quorumRequired"]),
        ),
        ("COUNTS", counts_line(&b["counts"])),
        ("DIGEST", s(&b["digest"])),
    ] {
        t.add_row([k.to_owned(), v]);
    }
    if let Some(errors) = b["errors"].as_object().filter(|e| !e.is_empty()) {
        let line = errors
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(" · ");
        t.add_row(["ERRORS".to_owned(), line]);
    }
    t
}

/// `metalctl bulk <verb>`.
#[allow(clippy::too_many_arguments)]
pub async fn submit(
    api: &Api,
    out: Output,
    tenant: &str,
    verb: &str,
    pool: &str,
    nodes_from: &Path,
    wipe: Option<&str>,
    reason: &str,
    expires_in_secs: Option<u64>,
) -> anyhow::Result<()> {
    let ids = node_ids(nodes_from)?;
    let mut body =
        json!({"tenantId": tenant, "poolId": pool, "verb": verb, "nodeIds": ids, "reason": reason});
    if let Some(w) = wipe {
        body["wipe"] = json!(w);
    }
    if let Some(e) = expires_in_secs {
        body["expiresInSecs"] = json!(e);
    }
    let v = api
        .call(reqwest::Method::POST, "/api/compute/metal/bulk", Some(body))
        .await?;
    if out == Output::Json {
        emit(serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let b = &v["batch"];
    emit(batch_table(b));
    if let Some(refused) = v["refused"].as_array().filter(|r| !r.is_empty()) {
        let mut t = Table::new();
        t.load_preset(UTF8_BORDERS_ONLY);
        t.set_header(["REFUSED NODE", "CODE", "WHY"]);
        for r in refused {
            t.add_row([
                r["nodeId"].as_str().unwrap_or("").to_owned(),
                r["code"].as_str().unwrap_or("").to_owned(),
                r["message"].as_str().unwrap_or("").to_owned(),
            ]);
        }
        emit(t);
    }
    let id = b["header"]["batchId"].as_str().unwrap_or("");
    emit(format!(
        "\nApprovers sign (ed25519) these bytes:\n{}\nEach approver: metalctl batch approve {id} --approver <id> --key <file>\nFollow it:     metalctl bulk watch {id}",
        b["approvalMessage"].as_str().unwrap_or("").trim_end()
    ));
    Ok(())
}

async fn get(api: &Api, id: &str) -> anyhow::Result<Value> {
    api.call(
        reqwest::Method::GET,
        &format!("/api/compute/metal/batches/{id}"),
        None,
    )
    .await
}

/// Every admitted node, by leaf index.
async fn leaves(api: &Api, id: &str) -> anyhow::Result<Vec<String>> {
    let mut after = -1i64;
    let mut admitted: Vec<(i64, String)> = vec![];
    loop {
        let page = api
            .call(
                reqwest::Method::GET,
                &format!("/api/compute/metal/batches/{id}/nodes?after={after}&limit=10000"),
                None,
            )
            .await?;
        let rows = page.as_array().cloned().unwrap_or_default();
        if rows.is_empty() {
            break;
        }
        for r in &rows {
            after = r["position"].as_i64().unwrap_or(after);
            if let (Some(i), Some(n)) = (r["leafIndex"].as_i64(), r["nodeId"].as_str()) {
                admitted.push((i, n.to_owned()));
            }
        }
    }
    admitted.sort();
    Ok(admitted.into_iter().map(|(_, n)| n).collect())
}

/// `metalctl batch show`.
pub async fn show(api: &Api, out: Output, id: &str) -> anyhow::Result<()> {
    let b = get(api, id).await?;
    match out {
        Output::Json => emit(serde_json::to_string_pretty(&b)?),
        Output::Table => emit(batch_table(&b)),
    }
    Ok(())
}

/// `metalctl batch list`.
pub async fn list(api: &Api, out: Output, tenant: &str, node: Option<&str>) -> anyhow::Result<()> {
    let path = match node {
        Some(n) => format!("/api/compute/metal/batches?nodeId={n}"),
        None => format!("/api/compute/metal/batches?tenantId={tenant}"),
    };
    let v = api.call(reqwest::Method::GET, &path, None).await?;
    if out == Output::Json {
        emit(serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY);
    t.set_header(["BATCH", "VERB", "STATE", "NODES", "COUNTS", "REASON"]);
    for b in v.as_array().cloned().unwrap_or_default() {
        let h = &b["header"];
        t.add_row([
            h["batchId"].as_str().unwrap_or("").to_owned(),
            h["operation"].as_str().unwrap_or("").to_owned(),
            b["state"].as_str().unwrap_or("").to_owned(),
            h["leafCount"].to_string(),
            counts_line(&b["counts"]),
            b["reason"].as_str().unwrap_or("").to_owned(),
        ]);
    }
    emit(t);
    Ok(())
}

/// `metalctl batch approve`: checks the root and the digest, then signs.
pub async fn approve(
    api: &Api,
    out: Output,
    id: &str,
    approver: &str,
    key_file: &Path,
    expected_nodes: Option<&Path>,
) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(key_file)
        .with_context(|| format!("reading {}", key_file.display()))?;
    let key = bcm_quorum::signing_key(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", key_file.display()))?;
    let b = get(api, id).await?;
    let header: BatchHeader =
        serde_json::from_value(b["header"].clone()).context("the batch's header")?;
    // What is signed is checked here, not taken from the server.
    let nodes = leaves(api, id).await?;
    let built = bcm_quorum::build(&nodes, header.operation, header.wipe)
        .context("the batch lists no admitted node")?;
    if built.root != header.root || nodes.len() as u32 != header.leaf_count {
        bail!(
            "batch {id}'s node list ({} nodes, root {}) does not match its header ({} nodes, root {}): not signing",
            nodes.len(),
            built.root,
            header.leaf_count,
            header.root
        );
    }
    let reason = b["reason"].as_str().unwrap_or("");
    if bcm_quorum::reason_sha256(reason) != header.reason_sha256 {
        bail!("batch {id}'s reason does not match its header: not signing");
    }
    // The requester's own list, when the approver has it: the batch may
    // hold no node it does not name.
    if let Some(path) = expected_nodes {
        let expected: std::collections::HashSet<String> = node_ids(path)?.into_iter().collect();
        let extra: Vec<&String> = nodes.iter().filter(|n| !expected.contains(*n)).collect();
        if !extra.is_empty() {
            bail!(
                "batch {id} holds {} node(s) {} does not name (first: {}): not signing",
                extra.len(),
                path.display(),
                extra[0]
            );
        }
    }
    let digest = hex::encode(bcm_quorum::digest(&header));
    let expires = chrono::DateTime::from_timestamp(header.expires_at, 0)
        .map(|d| d.to_rfc3339())
        .unwrap_or_default();
    eprintln!(
        "signing batch {id}: {}{} of {} nodes in {}/{} until {expires}: \"{reason}\" (digest {digest})",
        header.operation,
        header.wipe.map(|w| format!(" (wipe {w})")).unwrap_or_default(),
        header.leaf_count,
        header.tenant_id,
        header.pool_id
    );
    let v = api
        .call(
            reqwest::Method::POST,
            &format!("/api/compute/metal/batches/{id}/approve"),
            Some(json!({
                "approverId": approver,
                "signature": bcm_quorum::sign(&key, &header),
                "digest": digest,
            })),
        )
        .await?;
    match out {
        Output::Json => emit(serde_json::to_string_pretty(&v)?),
        Output::Table => emit(batch_table(&v)),
    }
    Ok(())
}

/// `metalctl batch reject` / `cancel`.
pub async fn end(
    api: &Api,
    out: Output,
    id: &str,
    action: &str,
    approver: Option<&str>,
    reason: Option<&str>,
) -> anyhow::Result<()> {
    let mut body = json!({});
    if let Some(a) = approver {
        body["approverId"] = json!(a);
    }
    if let Some(r) = reason {
        body["reason"] = json!(r);
    }
    let v = api
        .call(
            reqwest::Method::POST,
            &format!("/api/compute/metal/batches/{id}/{action}"),
            Some(body),
        )
        .await?;
    match out {
        Output::Json => emit(serde_json::to_string_pretty(&v)?),
        Output::Table => emit(batch_table(&v)),
    }
    Ok(())
}

/// `metalctl bulk watch`: a progress bar until the batch ends, then its
/// summary. Fails when a node failed.
pub async fn watch(
    api: &Api,
    out: Output,
    id: &str,
    every: std::time::Duration,
) -> anyhow::Result<()> {
    let first = get(api, id).await?;
    let total = first["header"]["leafCount"].as_u64().unwrap_or(0);
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(indicatif::ProgressStyle::with_template(
        "{elapsed:>4} [{bar:40}] {pos}/{len} done · {msg}",
    )?);
    let b = loop {
        let b = get(api, id).await?;
        let c = &b["counts"];
        let done = ["succeeded", "failed", "cancelled"]
            .iter()
            .map(|k| c[*k].as_u64().unwrap_or(0))
            .sum::<u64>()
            // Refused when their wave came (not at admission).
            + c["refused"].as_u64().unwrap_or(0).saturating_sub(
                first["counts"]["refused"].as_u64().unwrap_or(0),
            );
        bar.set_position(done);
        bar.set_message(format!(
            "{} · {}",
            b["state"].as_str().unwrap_or("?"),
            counts_line(c)
        ));
        if matches!(
            b["state"].as_str(),
            Some("finished" | "expired" | "rejected" | "cancelled")
        ) && c["started"].as_u64().unwrap_or(0) == 0
        {
            bar.finish_and_clear();
            break b;
        }
        tokio::time::sleep(every).await;
    };
    match out {
        Output::Json => emit(serde_json::to_string_pretty(&b)?),
        Output::Table => emit(batch_table(&b)),
    }
    let failed = b["counts"]["failed"].as_u64().unwrap_or(0);
    if failed > 0 {
        bail!("{failed} node(s) of batch {id} failed");
    }
    Ok(())
}
