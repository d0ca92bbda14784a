//! `metalctl profiles`, `metalctl image register|list|show|prewarm`,
//! `metalctl hardware-profiles`, `metalctl pools` and `metalctl site-proxy`:
//! the tenant's deploy profile and image catalogs (publish or register
//! from a JSON file, list, show, pre-warm a site's cache), the site's
//! hardware profiles, the pools' policy and a site's upstream HTTP proxy,
//! as tables a person reads or `--output json` for scripts.

use anyhow::Context as _;
use comfy_table::{presets::UTF8_BORDERS_ONLY, Table};
use serde_json::Value;
use std::path::Path;

use crate::{emit, Api, Output};

fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY);
    t.set_header(header.iter().copied());
    t
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// FILE as a JSON object with `fields` set (the tenant, a name).
fn object_file(file: &Path, fields: &[(&str, &str)]) -> anyhow::Result<Value> {
    let text_in =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let mut body: Value = serde_json::from_str(&text_in)
        .with_context(|| format!("{} is not a JSON object", file.display()))?;
    let obj = body
        .as_object_mut()
        .with_context(|| format!("{} is not a JSON object", file.display()))?;
    for (k, v) in fields {
        obj.insert((*k).to_owned(), Value::String((*v).to_owned()));
    }
    Ok(body)
}

/// `v` as JSON, or as a table of `header` with a row per item (an array)
/// or one row (an object).
fn emit_rows(out: Output, v: Value, header: &[&str], row: fn(&mut Table, &Value)) {
    match out {
        Output::Json => emit(v),
        Output::Table => {
            let mut t = table(header);
            match v.as_array() {
                Some(items) => items.iter().for_each(|i| row(&mut t, i)),
                None => row(&mut t, &v),
            }
            emit(t);
        }
    }
}

fn profile_row(t: &mut Table, p: &Value) {
    let d = &p["profile"];
    let image = &d["image"];
    t.add_row([
        text(&d["id"]),
        text(&d["version"]),
        text(&d["role"]),
        format!("{} ({})", text(&image["url"]), text(&image["format"])),
        text(&image["sha256"]).chars().take(12).collect::<String>(),
        text(&p["publishedBy"]),
        text(&p["publishedAt"]),
    ]);
}

const PROFILE_HEADER: [&str; 7] = [
    "PROFILE",
    "VERSION",
    "ROLE",
    "IMAGE",
    "SHA256",
    "PUBLISHED BY",
    "AT",
];

/// `metalctl profiles publish FILE`: the profile (`id`, `version`, `role`,
/// `image`, `userData` or `userDataTemplate`) as JSON; the tenant is
/// `--tenant`'s.
pub async fn publish(api: &Api, out: Output, tenant: &str, file: &Path) -> anyhow::Result<()> {
    let body = object_file(file, &[("tenantId", tenant)])?;
    let v = api
        .call(
            reqwest::Method::POST,
            "/api/compute/deployProfiles",
            Some(body),
        )
        .await?;
    emit_rows(out, v, &PROFILE_HEADER, profile_row);
    Ok(())
}

/// `metalctl profiles list [--id ID]`.
pub async fn list(api: &Api, out: Output, tenant: &str, id: Option<&str>) -> anyhow::Result<()> {
    let mut path = format!("/api/compute/deployProfiles?tenantId={tenant}");
    if let Some(id) = id {
        path.push_str(&format!("&id={id}"));
    }
    let v = api.call(reqwest::Method::GET, &path, None).await?;
    emit_rows(out, v, &PROFILE_HEADER, profile_row);
    Ok(())
}

/// `metalctl profiles show ID VERSION`: the version with its user data.
pub async fn show(
    api: &Api,
    out: Output,
    tenant: &str,
    id: &str,
    version: u32,
) -> anyhow::Result<()> {
    let v = api
        .call(
            reqwest::Method::GET,
            &format!("/api/compute/deployProfiles/{tenant}/{id}/{version}"),
            None,
        )
        .await?;
    match out {
        Output::Json => emit(v),
        Output::Table => {
            let mut t = table(&PROFILE_HEADER);
            profile_row(&mut t, &v);
            emit(t);
            emit("user data:");
            emit(text(&v["profile"]["userData"]));
        }
    }
    Ok(())
}

/// `metalctl hardware-profiles`.
pub async fn hardware_profiles(api: &Api, out: Output) -> anyhow::Result<()> {
    let v = api
        .call(reqwest::Method::GET, "/api/compute/hardwareProfiles", None)
        .await?;
    match out {
        Output::Json => emit(v),
        Output::Table => {
            let mut t = table(&[
                "PROFILE",
                "POWER",
                "MANAGEMENT",
                "BOOT",
                "DEPLOY",
                "INSPECT",
                "DESCRIPTION",
            ]);
            for p in v.as_array().into_iter().flatten() {
                let d = &p["drivers"];
                let name = if p["default"] == Value::Bool(true) {
                    format!("{} (default)", text(&p["name"]))
                } else {
                    text(&p["name"])
                };
                t.add_row([
                    name,
                    text(&d["power"]),
                    text(&d["management"]),
                    text(&d["boot"]),
                    text(&d["deploy"]),
                    text(&d["inspect"]),
                    text(&p["description"]),
                ]);
            }
            emit(t);
        }
    }
    Ok(())
}

/// `metalctl pools`: every pool of `--tenant` with its policy (the
/// bootstrap admin's).
pub async fn pools(api: &Api, out: Output, tenant: &str) -> anyhow::Result<()> {
    let v = api
        .call(
            reqwest::Method::GET,
            &format!("/api/compute/admin/pools?tenantId={tenant}"),
            None,
        )
        .await?;
    match out {
        Output::Json => emit(v),
        Output::Table => {
            let mut t = table(&[
                "POOL",
                "SITE",
                "HARDWARE",
                "AGENT",
                "DEPLOY PROFILES",
                "RELEASE WIPE",
                "COMMISSION WIPE",
                "QUORUM",
                "WAVE",
            ]);
            for p in v.as_array().into_iter().flatten() {
                let profiles = match p["deployProfiles"].as_array() {
                    Some(a) => a.iter().map(text).collect::<Vec<_>>().join(", "),
                    None => "(any)".to_owned(),
                };
                t.add_row([
                    text(&p["id"]),
                    text(&p["siteId"]),
                    text(&p["hardwareProfile"]),
                    text(&p["agentMode"]),
                    profiles,
                    text(&p["releaseWipe"]),
                    text(&p["commissionWipe"]),
                    text(&p["quorum"]["required"]),
                    text(&p["quorum"]["bulkConcurrency"]),
                ]);
            }
            emit(t);
        }
    }
    Ok(())
}

fn image_row(t: &mut Table, i: &Value) {
    let image = &i["image"];
    t.add_row([
        text(&i["name"]),
        format!("{} ({})", text(&image["url"]), text(&image["format"])),
        text(&image["sha256"]).chars().take(12).collect::<String>(),
        text(&image["sizeBytes"]),
        if image["signature"].is_string() {
            "yes"
        } else {
            "no"
        }
        .to_owned(),
        match image["dataRanges"].as_array() {
            Some(runs) => format!(
                "{} runs, {} bytes",
                runs.len(),
                runs.iter()
                    .filter_map(|r| r["length"].as_u64())
                    .sum::<u64>()
            ),
            None => "-".to_owned(),
        },
        text(&i["registeredBy"]),
    ]);
}

const IMAGE_HEADER: [&str; 7] = [
    "IMAGE",
    "URL",
    "SHA256",
    "BYTES",
    "SIGNED",
    "BLOCK MAP",
    "BY",
];

/// `metalctl image register NAME FILE`: FILE is the signed reference
/// `metalctl image sign` prints (`url`, `format`, `sha256`, `sizeBytes`,
/// `signature`, a raw image's `dataRanges`).
pub async fn image_register(
    api: &Api,
    out: Output,
    tenant: &str,
    name: &str,
    file: &Path,
) -> anyhow::Result<()> {
    let body = object_file(file, &[("tenantId", tenant), ("name", name)])?;
    let v = api
        .call(reqwest::Method::POST, "/api/compute/images", Some(body))
        .await?;
    emit_rows(out, v, &IMAGE_HEADER, image_row);
    Ok(())
}

/// `metalctl image list`.
pub async fn image_list(api: &Api, out: Output, tenant: &str) -> anyhow::Result<()> {
    let v = api
        .call(
            reqwest::Method::GET,
            &format!("/api/compute/images?tenantId={tenant}"),
            None,
        )
        .await?;
    emit_rows(out, v, &IMAGE_HEADER, image_row);
    Ok(())
}

/// `metalctl image show NAME`: the image and each site's cache of it.
pub async fn image_show(api: &Api, out: Output, tenant: &str, name: &str) -> anyhow::Result<()> {
    let v = api
        .call(
            reqwest::Method::GET,
            &format!("/api/compute/images/{tenant}/{name}"),
            None,
        )
        .await?;
    match out {
        Output::Json => emit(v),
        Output::Table => {
            let mut t = table(&IMAGE_HEADER);
            image_row(&mut t, &v);
            emit(t);
            let mut sites = table(&["SITE", "CACHE", "VIA", "ASKED BY", "AT", "ERROR"]);
            for c in v["sites"].as_array().into_iter().flatten() {
                sites.add_row([
                    text(&c["siteId"]),
                    text(&c["status"]),
                    text(&c["via"]),
                    text(&c["requestedBy"]),
                    text(&c["completedAt"]),
                    text(&c["error"]),
                ]);
            }
            emit(format!("site caches of {}:", text(&v["cachePath"])));
            emit(sites);
        }
    }
    Ok(())
}

/// `metalctl image prewarm NAME --site SITE`.
pub async fn image_prewarm(
    api: &Api,
    out: Output,
    tenant: &str,
    name: &str,
    site: &str,
) -> anyhow::Result<()> {
    let v = api
        .call(
            reqwest::Method::POST,
            &format!("/api/compute/images/{tenant}/{name}/prewarm"),
            Some(serde_json::json!({ "siteId": site })),
        )
        .await?;
    match out {
        Output::Json => emit(v),
        Output::Table => emit(format!(
            "asked site {} to cache {} ({}) via {}; `metalctl image show {name}` shows when it is there",
            text(&v["siteId"]),
            text(&v["cachePath"]),
            text(&v["commandId"]),
            v["upstreamProxy"].as_str().unwrap_or("a direct fetch")
        )),
    }
    Ok(())
}

/// `metalctl site-proxy SITE [URL | --clear]`: shows or sets the proxy a
/// site's image cache fetches through (administrators).
pub async fn site_proxy(
    api: &Api,
    out: Output,
    site: &str,
    set: Option<Option<&str>>,
) -> anyhow::Result<()> {
    let path = format!("/api/compute/admin/sites/{site}");
    let v = match set {
        None => api.call(reqwest::Method::GET, &path, None).await?,
        Some(proxy) => {
            api.call(
                reqwest::Method::PUT,
                &format!("{path}/httpProxy"),
                Some(serde_json::json!({ "httpProxy": proxy })),
            )
            .await?
        }
    };
    match out {
        Output::Json => emit(v),
        Output::Table => {
            let mut t = table(&["SITE", "NAME", "HTTP PROXY", "SET BY"]);
            t.add_row([
                text(&v["id"]),
                text(&v["name"]),
                v["httpProxy"].as_str().unwrap_or("(direct)").to_owned(),
                text(&v["httpProxySetBy"]),
            ]);
            emit(t);
        }
    }
    Ok(())
}
