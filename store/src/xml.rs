//! The little XML the REST stores answer with (S3 error documents, Azure
//! listings and block lists), read by element name: the documents are
//! flat, machine-written and small per element, so a reader of their
//! known shape is all that is needed.

/// The text inside the first `<name>…</name>` of `body`, unescaped later.
pub(crate) fn element<'a>(body: &'a str, name: &str) -> Option<&'a str> {
    let open = format!("<{name}>");
    let start = body.find(&open)? + open.len();
    let end = start + body[start..].find(&format!("</{name}>"))?;
    Some(&body[start..end])
}

/// The text inside every `<name>…</name>` of `body`, in order.
pub(crate) fn elements<'a>(body: &'a str, name: &str) -> Vec<&'a str> {
    let (open, close) = (format!("<{name}>"), format!("</{name}>"));
    let mut found = Vec::new();
    let mut rest = body;
    while let Some(at) = rest.find(&open) {
        let start = at + open.len();
        let Some(length) = rest[start..].find(&close) else { break };
        found.push(&rest[start..start + length]);
        rest = &rest[start + length + close.len()..];
    }
    found
}

/// The code and message of an error document (`<Error><Code>…</Code>
/// <Message>…</Message></Error>`, S3's and Azure's), or empty strings for
/// a body that is none (a HEAD, or a proxy's HTML page).
pub(crate) fn error_document(body: &str) -> (String, String) {
    let code = element(body, "Code").map(unescape).unwrap_or_default();
    let message = element(body, "Message").map(unescape).unwrap_or_default();
    (code, message)
}

/// Text with XML's character references replaced (MinIO quotes with `&#34;`).
pub(crate) fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find('&') {
        out.push_str(&rest[..start]);
        rest = &rest[start..];
        let Some(end) = rest.find(';') else { break };
        let entity = &rest[1..end];
        let decoded = match entity {
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            "amp" => Some('&'),
            _ => entity
                .strip_prefix("#x")
                .map_or_else(
                    || entity.strip_prefix('#').and_then(|n| n.parse().ok()),
                    |hex| u32::from_str_radix(hex, 16).ok(),
                )
                .and_then(char::from_u32),
        };
        match decoded {
            Some(c) => {
                out.push(c);
                rest = &rest[end + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Text made safe inside an element.
pub(crate) fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_are_read_by_name_and_unescaped() {
        let body = "<L><Blob><Name>a&amp;b</Name></Blob><Blob><Name>c</Name></Blob><NextMarker/></L>";
        assert_eq!(elements(body, "Name"), ["a&amp;b", "c"]);
        assert_eq!(unescape(elements(body, "Name")[0]), "a&b");
        assert_eq!(element(body, "NextMarker"), None, "an empty element is written self-closed");
        assert_eq!(unescape("want &#34;CRC32C&#34; &#x26; &bogus; & more"), "want \"CRC32C\" & &bogus; & more");
        assert_eq!(escape("a<b&c"), "a&lt;b&amp;c");
        assert_eq!(
            error_document("<Error><Code>BlobNotFound</Code><Message>gone &amp; away</Message></Error>"),
            ("BlobNotFound".to_owned(), "gone & away".to_owned())
        );
    }
}
