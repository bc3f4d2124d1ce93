//! Just enough DER to read an X.509 certificate's names: the subject's common names and
//! whether it has a subjectAltName extension, for the client's name check on a certificate
//! without one ([`crate::tls`]). The certificate comes from the server, so this reads
//! untrusted bytes: every length is checked against what is left, nothing is trusted past
//! its own element, and anything not laid out as RFC 5280 says is `None`, never a panic.
//!
//! Layout read (RFC 5280, 4.1): Certificate ::= SEQUENCE { tbsCertificate, ... };
//! TBSCertificate ::= SEQUENCE { \[0\] version OPTIONAL, serialNumber, signature, issuer,
//! validity, subject, subjectPublicKeyInfo, \[1\] OPTIONAL, \[2\] OPTIONAL, \[3\] extensions
//! OPTIONAL }; Name ::= SEQUENCE OF SET OF SEQUENCE { type OID, value };
//! Extensions ::= SEQUENCE OF SEQUENCE { extnID OID, critical BOOLEAN OPTIONAL, OCTET STRING }.

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
/// `[0]` (version) and `[3]` (extensions), constructed, context-specific.
const VERSION: u8 = 0xa0;
const EXTENSIONS: u8 = 0xa3;
/// id-at-commonName, 2.5.4.3.
const COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
/// id-ce-subjectAltName, 2.5.29.17.
const SUBJECT_ALT_NAME: &[u8] = &[0x55, 0x1d, 0x11];
/// String types a common name may be: UTF8String, PrintableString, T61String, IA5String,
/// BMPString is left out (no host name is written in it).
const STRING_TAGS: [u8; 4] = [0x0c, 0x13, 0x14, 0x16];

/// A certificate's names, as the name check needs them.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Names {
    /// The subject's common names (as text; those not text are left out).
    pub common_names: Vec<String>,
    /// Whether the certificate has a subjectAltName extension.
    pub has_subject_alt_name: bool,
}

/// One element: its tag and its contents.
struct Element<'a> {
    tag: u8,
    contents: &'a [u8],
}

/// Reads elements one after another out of a slice.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { rest: bytes }
    }

    fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    /// The next element; `None` if what is left is not one whole element.
    fn next(&mut self) -> Option<Element<'a>> {
        let (&tag, rest) = self.rest.split_first()?;
        let (&first, rest) = rest.split_first()?;
        let (len, rest) = if first < 0x80 {
            (usize::from(first), rest)
        } else {
            // The long form: 1 to 4 bytes of length (a certificate is never 4 GiB).
            let n = usize::from(first & 0x7f);
            if n == 0 || n > 4 || rest.len() < n {
                return None;
            }
            let len = rest[..n]
                .iter()
                .fold(0usize, |len, &b| (len << 8) | usize::from(b));
            (len, &rest[n..])
        };
        if rest.len() < len {
            return None;
        }
        let (contents, rest) = rest.split_at(len);
        self.rest = rest;
        Some(Element { tag, contents })
    }

    /// The next element, which must have tag `tag`.
    fn expect(&mut self, tag: u8) -> Option<&'a [u8]> {
        self.next().filter(|e| e.tag == tag).map(|e| e.contents)
    }
}

/// The names of the DER certificate `cert`; `None` if it is not laid out as a certificate.
pub fn names(cert: &[u8]) -> Option<Names> {
    let certificate = Reader::new(cert).expect(SEQUENCE)?;
    let mut tbs = Reader::new(Reader::new(certificate).expect(SEQUENCE)?);
    let mut first = tbs.next()?;
    if first.tag == VERSION {
        first = tbs.next()?; // the serial number
    }
    let _serial = first;
    tbs.expect(SEQUENCE)?; // signature
    tbs.expect(SEQUENCE)?; // issuer
    tbs.expect(SEQUENCE)?; // validity
    let subject = tbs.expect(SEQUENCE)?;
    tbs.expect(SEQUENCE)?; // subjectPublicKeyInfo
    let mut names = Names::default();
    let mut rdns = Reader::new(subject);
    while !rdns.is_empty() {
        let mut attributes = Reader::new(rdns.expect(SET)?);
        while !attributes.is_empty() {
            let mut attribute = Reader::new(attributes.expect(SEQUENCE)?);
            let kind = attribute.expect(OID)?;
            let value = attribute.next()?;
            if kind == COMMON_NAME && STRING_TAGS.contains(&value.tag) {
                if let Ok(text) = std::str::from_utf8(value.contents) {
                    names.common_names.push(text.to_string());
                }
            }
        }
    }
    while let Some(e) = tbs.next() {
        if e.tag != EXTENSIONS {
            continue; // issuerUniqueID, subjectUniqueID
        }
        let mut extensions = Reader::new(Reader::new(e.contents).expect(SEQUENCE)?);
        while !extensions.is_empty() {
            let mut extension = Reader::new(extensions.expect(SEQUENCE)?);
            if extension.expect(OID)? == SUBJECT_ALT_NAME {
                names.has_subject_alt_name = true;
            }
        }
    }
    if !tbs.is_empty() {
        return None;
    }
    Some(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DER element of `tag` around `contents`.
    fn el(tag: u8, contents: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        if contents.len() < 0x80 {
            out.push(contents.len() as u8);
        } else {
            out.extend([0x82, (contents.len() >> 8) as u8, contents.len() as u8]);
        }
        out.extend_from_slice(contents);
        out
    }

    fn cat(parts: &[Vec<u8>]) -> Vec<u8> {
        parts.concat()
    }

    fn cert(subject_cns: &[&str], san: bool) -> Vec<u8> {
        let rdns: Vec<Vec<u8>> = subject_cns
            .iter()
            .map(|cn| {
                el(
                    SET,
                    &el(
                        SEQUENCE,
                        &cat(&[el(OID, COMMON_NAME), el(0x0c, cn.as_bytes())]),
                    ),
                )
            })
            .collect();
        let mut tbs = vec![
            el(VERSION, &el(0x02, &[2])),
            el(0x02, &[1]),
            el(SEQUENCE, &el(OID, &[0x2a])),
            el(SEQUENCE, &[]),
            el(SEQUENCE, &[]),
            el(SEQUENCE, &cat(&rdns)),
            el(SEQUENCE, &el(OID, &[0x2a])),
        ];
        let ext_oid = if san {
            SUBJECT_ALT_NAME
        } else {
            &[0x55, 0x1d, 0x13]
        };
        tbs.push(el(
            EXTENSIONS,
            &el(
                SEQUENCE,
                &el(SEQUENCE, &cat(&[el(OID, ext_oid), el(0x04, &[0x30, 0])])),
            ),
        ));
        el(
            SEQUENCE,
            &cat(&[el(SEQUENCE, &cat(&tbs)), el(SEQUENCE, &[])]),
        )
    }

    #[test]
    fn common_names_and_the_alt_name_extension_are_found() {
        let n = names(&cert(&["localhost", "other"], false)).unwrap();
        assert_eq!(n.common_names, ["localhost", "other"]);
        assert!(!n.has_subject_alt_name);
        assert!(names(&cert(&["x"], true)).unwrap().has_subject_alt_name);
    }

    /// Cut anywhere, or with a length byte changed, a certificate is `None` or read within
    /// its bounds: never a panic.
    #[test]
    fn damaged_certificates_are_refused_not_a_panic() {
        let good = cert(&["localhost"], true);
        for cut in 0..good.len() {
            assert!(names(&good[..cut]).is_none(), "cut at {cut}");
        }
        for at in 0..good.len() {
            for v in [0x00, 0x7f, 0x80, 0x81, 0x84, 0x85, 0xff] {
                let mut bad = good.clone();
                bad[at] = v;
                let _ = names(&bad);
            }
        }
    }
}
