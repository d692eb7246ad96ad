//! PURE: the AWS region in an MSK broker's or an RDS endpoint's host name, the region the
//! relay signs for when neither `--aws-region` nor the environment names one.

/// The region in an AWS service host name: `b-1.orders.abc123.c2.kafka.eu-west-1.amazonaws.com`
/// (MSK), `boot-abc.c1.kafka-serverless.us-east-1.amazonaws.com` (MSK Serverless),
/// `db.abc.us-east-1.rds.amazonaws.com` (RDS, Aurora, RDS Proxy); `None` for other hosts.
pub fn from_host(host: &str) -> Option<String> {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let labels: Vec<&str> = host.split('.').collect();
    let amazonaws = labels.iter().rposition(|label| *label == "amazonaws")?;
    let before = |n: usize| labels.get(amazonaws.checked_sub(n)?).copied();
    // RDS: `<id>.<region>.rds.amazonaws.com`; MSK: `...kafka.<region>.amazonaws.com`.
    let region = match before(1)? {
        "rds" => before(2)?,
        region if matches!(before(2)?, "kafka" | "kafka-serverless") => region,
        _ => return None,
    };
    looks_like_region(region).then(|| region.to_owned())
}

/// The one region the hosts name, if they name exactly one (`host` or `host:port` each).
pub fn from_hosts<'a>(hosts: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let mut found: Option<String> = None;
    for host in hosts {
        let name = host.rsplit_once(':').map_or(host, |(name, _)| name);
        match (from_host(name), &found) {
            (Some(region), Some(seen)) if region != *seen => return None,
            (Some(region), None) => found = Some(region),
            _ => {}
        }
    }
    found
}

/// `us-east-1`, `eu-central-2`, `us-gov-west-1`, `cn-north-1`: letters, then dashes and a
/// trailing number.
fn looks_like_region(label: &str) -> bool {
    let mut parts = label.split('-');
    let first = parts.next().unwrap_or_default();
    let rest: Vec<&str> = parts.collect();
    let number = rest
        .last()
        .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()));
    let words = rest.len() >= 2 && rest[..rest.len() - 1].iter().all(|w| is_word(w));
    is_word(first) && words && number
}

fn is_word(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_region_is_read_from_aws_host_names_only() {
        for (host, expected) in [
            (
                "b-1.orders.abc123.c2.kafka.eu-west-1.amazonaws.com",
                Some("eu-west-1"),
            ),
            (
                "boot-abc.c1.kafka-serverless.us-east-1.amazonaws.com",
                Some("us-east-1"),
            ),
            (
                "mydb.abcdefghijkl.us-east-1.rds.amazonaws.com",
                Some("us-east-1"),
            ),
            (
                "orders.cluster-ro-abc.eu-central-1.rds.amazonaws.com.",
                Some("eu-central-1"),
            ),
            (
                "relay.proxy-abc.us-gov-west-1.rds.amazonaws.com",
                Some("us-gov-west-1"),
            ),
            ("db.abc.cn-north-1.rds.amazonaws.com.cn", Some("cn-north-1")),
            ("MYDB.ABC.US-EAST-2.RDS.AMAZONAWS.COM", Some("us-east-2")),
            ("kafka.internal", None),
            ("127.0.0.1", None),
            ("bucket.s3.us-east-1.amazonaws.com", None),
            ("rds.amazonaws.com", None),
            ("x.rds.notaregion.amazonaws.com", None),
            ("", None),
        ] {
            assert_eq!(from_host(host).as_deref(), expected, "{host}");
        }
    }

    #[test]
    fn several_hosts_name_one_region_or_none() {
        let msk = [
            "b-1.c.abc.c2.kafka.eu-west-1.amazonaws.com:9098",
            "b-2.c.abc.c2.kafka.eu-west-1.amazonaws.com:9098",
        ];
        assert_eq!(from_hosts(msk).as_deref(), Some("eu-west-1"));
        let mixed = [
            "b-1.c.abc.c2.kafka.eu-west-1.amazonaws.com:9098",
            "kafka.local:9092",
        ];
        assert_eq!(from_hosts(mixed).as_deref(), Some("eu-west-1"));
        let two = [
            "b-1.c.abc.c2.kafka.eu-west-1.amazonaws.com:9098",
            "db.abc.us-east-1.rds.amazonaws.com",
        ];
        assert_eq!(from_hosts(two), None);
        assert_eq!(from_hosts(["localhost:9092"]), None);
    }
}
