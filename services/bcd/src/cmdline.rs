//! Boot parameters from the kernel command line: `bcm.node=`, `bcm.api=`,
//! `bcm.join=` (the one-time discovery token), when the site has one,
//! `bcm.proxy=` (the site's forward proxy), and `bcm.cache=` (the boot
//! server's image cache, which catalog images are fetched from first).

/// What the ramdisk needs to join.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootParams {
    pub node: String,
    pub api: String,
    pub join: String,
    pub proxy: Option<String>,
    pub cache: Option<String>,
}

/// Parses a kernel command line; `None` when a required key is missing.
pub fn parse(cmdline: &str) -> Option<BootParams> {
    let get = |k: &str| {
        cmdline
            .split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    Some(BootParams {
        node: get("bcm.node=")?,
        api: get("bcm.api=")?,
        join: get("bcm.join=")?,
        proxy: get("bcm.proxy="),
        cache: get("bcm.cache=").filter(|c| c.starts_with("http://") || c.starts_with("https://")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_keys_and_ignores_the_rest() {
        let p = parse(
            "console=ttyS0 bcm.node=node_1 bcm.api=http://10.0.0.1:8080 bcm.join=bcmj_x quiet",
        )
        .expect("params");
        assert_eq!(p.node, "node_1");
        assert_eq!(p.api, "http://10.0.0.1:8080");
        assert_eq!(p.join, "bcmj_x");
        assert_eq!(p.proxy, None);
        assert!(parse("console=ttyS0 bcm.node=n bcm.api=").is_none());
        assert_eq!(
            parse("bcm.node=n bcm.api=a bcm.join=j bcm.proxy=http://p:3128").and_then(|p| p.proxy),
            Some("http://p:3128".into())
        );
        assert_eq!(
            parse("bcm.node=n bcm.api=a bcm.join=j bcm.cache=http://10.0.0.1:8081/images/")
                .and_then(|p| p.cache),
            Some("http://10.0.0.1:8081/images/".into())
        );
        assert_eq!(
            parse("bcm.node=n bcm.api=a bcm.join=j bcm.cache=file:///etc").and_then(|p| p.cache),
            None,
            "only an http(s) cache"
        );
    }
}
