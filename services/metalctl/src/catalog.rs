//! `metalctl profiles`, `metalctl hardware-profiles` and `metalctl pools`:
//! the tenant's deploy profile catalog (publish from a JSON file, list,
//! show), the site's hardware profiles and the pools' policy, as tables a
//! person reads or `--output json` for scripts.

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
    let text_in =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let mut body: Value = serde_json::from_str(&text_in)
        .with_context(|| format!("{} is not a JSON object", file.display()))?;
    let obj = body
        .as_object_mut()
        .with_context(|| format!("{} is not a JSON object", file.display()))?;
    obj.insert("tenantId".into(), Value::String(tenant.to_owned()));
    let v = api
        .call(
            reqwest::Method::POST,
            "/api/compute/deployProfiles",
            Some(body),
        )
        .await?;
    match out {
        Output::Json => emit(v),
        Output::Table => {
            let mut t = table(&PROFILE_HEADER);
            profile_row(&mut t, &v);
            emit(t);
        }
    }
    Ok(())
}

/// `metalctl profiles list [--id ID]`.
pub async fn list(api: &Api, out: Output, tenant: &str, id: Option<&str>) -> anyhow::Result<()> {
    let mut path = format!("/api/compute/deployProfiles?tenantId={tenant}");
    if let Some(id) = id {
        path.push_str(&format!("&id={id}"));
    }
    let v = api.call(reqwest::Method::GET, &path, None).await?;
    match out {
        Output::Json => emit(v),
        Output::Table => {
            let mut t = table(&PROFILE_HEADER);
            for p in v.as_array().into_iter().flatten() {
                profile_row(&mut t, p);
            }
            emit(t);
        }
    }
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
                    text(&p["quorum"]["required"]),
                    text(&p["quorum"]["bulkConcurrency"]),
                ]);
            }
            emit(t);
        }
    }
    Ok(())
}
