//! Path scopes: a request path read as the segments a router or proxy would take it for, and
//! the patterns of [`Rule::path`](crate::Rule::path) and [`Rule::grpc`](crate::Rule::grpc)
//! matched against them.
//!
//! Before matching, the path is normalized as servers normalize it: empty segments are dropped
//! (`//login` is `/login`, as nginx's `merge_slashes`, which runs before dot segments are
//! removed), then dot segments are removed as RFC 3986 §5.2.4 says (`/./login`, `/x/../login`
//! and `/login/.` are `/login`; a `..` at the root stays there). A dot segment may be
//! percent-encoded (`%2e`, `.%2E`, `%2e%2e`): it is a dot segment once decoded, as it is for
//! any server that decodes before it normalizes. Other segments are compared with the pattern's
//! as they are or, when percent-encoded, as they decode (`/%6Cogin` is `/login`); an encoded
//! slash stays inside its segment (`/a%2Fb` is one segment).
//!
//! The request path is read on every request by every rule with a scope: a path with no dot
//! segment (nearly all of them) is matched as it is read, with no copy; only a path with one is
//! normalized, into a small inline list of its segments.

use smallvec::SmallVec;

/// The compiled form of a path pattern: its segments, normalized as request paths are.
pub(super) fn pattern(pattern: &str) -> Vec<String> {
    normalized(pattern).into_iter().map(str::to_owned).collect()
}

/// Whether the request `path` is matched by `pattern` (compiled by [`pattern`]).
///
/// A pattern is matched segment by segment: `*` matches one segment, and a final `*` matches one
/// or more remaining segments.
pub(super) fn matches(pattern: &[String], path: &str) -> bool {
    if segments(path).any(|segment| dot(segment).is_some()) {
        return matches_segments(pattern, normalized(path).into_iter());
    }
    matches_segments(pattern, segments(path))
}

/// The non-empty segments of `path`.
fn segments(path: &str) -> impl Iterator<Item = &str> {
    path.split('/').filter(|s| !s.is_empty())
}

/// A dot segment: the current (`.`) or the parent (`..`) one.
enum Dot {
    Current,
    Parent,
}

/// Which dot segment `segment` is, percent-encoded or not, if it is one.
fn dot(segment: &str) -> Option<Dot> {
    // At most two dots, each written `.` or `%2e`: six bytes, starting with one or the other.
    if segment.len() > 6 || !segment.starts_with(['.', '%']) {
        return None;
    }
    let mut dots = 0;
    for byte in percent_encoding::percent_decode_str(segment) {
        if byte != b'.' {
            return None;
        }
        dots += 1;
    }
    match dots {
        1 => Some(Dot::Current),
        2 => Some(Dot::Parent),
        _ => None,
    }
}

/// The segments of `path` once empty and dot segments are removed (`..` takes the segment
/// before it away, if any).
#[cold]
fn normalized(path: &str) -> SmallVec<[&str; 16]> {
    let mut kept = SmallVec::new();
    for segment in segments(path) {
        match dot(segment) {
            Some(Dot::Current) => {}
            Some(Dot::Parent) => {
                kept.pop();
            }
            None => kept.push(segment),
        }
    }
    kept
}

fn matches_segments<'a>(pattern: &[String], mut path: impl Iterator<Item = &'a str>) -> bool {
    for (i, want) in pattern.iter().enumerate() {
        let last = i + 1 == pattern.len();
        match path.next() {
            None => return false,
            Some(_) if want == "*" && last => return true,
            Some(seg) if want == "*" || want == seg || decodes_to(seg, want) => {}
            Some(_) => return false,
        }
    }
    path.next().is_none()
}

/// Whether the percent-encoded `segment` decodes to `want` (bytes compared: a segment that is
/// not UTF-8 once decoded matches no pattern, as no literal pattern is).
#[cold]
fn decodes_to(segment: &str, want: &str) -> bool {
    segment.contains('%') && percent_encoding::percent_decode_str(segment).eq(want.bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_in(pattern_text: &str, path: &str) -> bool {
        matches(&pattern(pattern_text), path)
    }

    #[test]
    fn patterns_match_segment_by_segment() {
        assert!(is_in("/login", "/login"));
        assert!(is_in("/login", "/login/"));
        assert!(!is_in("/login", "/login/x"));
        assert!(!is_in("/login", "/logins"));
        assert!(is_in("/api/*", "/api/v1"));
        assert!(is_in("/api/*", "/api/v1/chat"));
        assert!(!is_in("/api/*", "/api"));
        assert!(!is_in("/api/*", "/apix/v1"));
        assert!(is_in("/users/*/avatar", "/users/7/avatar"));
        assert!(!is_in("/users/*/avatar", "/users/7/name"));
        assert!(is_in("/", "/"));
        assert!(!is_in("/", "/x"));
    }

    #[test]
    fn repeated_slashes_count_as_one() {
        assert!(is_in("/login", "//login"));
        assert!(is_in("/v1/exports", "/v1//exports//"));
        assert!(is_in("/api/*", "///api///v1"));
    }

    #[test]
    fn dot_segments_are_removed_before_matching() {
        for path in [
            "/./login",
            "/login/.",
            "/x/../login",
            "/login/x/..",
            "/a/b/../../login",
            "/../login",
            "/../../login/./",
            "/./././login",
            "//x//..//login",
        ] {
            assert!(is_in("/login", path), "{path}");
        }
        assert!(is_in("/v1/exports", "/v1/./exports"));
        assert!(is_in("/v1/exports", "/v2/../v1/exports"));
        assert!(is_in("/api/*", "/api/v1/../v2"));
        assert!(!is_in("/api/*", "/api/v1/.."));
        assert!(!is_in("/api/*", "/api/.."));
        assert!(is_in("/", "/login/.."));
        assert!(is_in("/", "/.."));
        assert!(!is_in("/login", "/login/../x"));
        assert!(!is_in("/login", "/x/./login"));
        // Not dot segments: dots inside a name, or three of them.
        assert!(!is_in("/login", "/.../login"));
        assert!(!is_in("/login", "/x/.../login"));
        assert!(is_in("/static/*", "/static/app.js"));
        assert!(is_in("/x/*", "/x/..."));
    }

    #[test]
    fn percent_encoded_dot_segments_are_dot_segments() {
        for path in [
            "/%2e/login",
            "/%2E/login",
            "/x/%2e%2e/login",
            "/x/.%2E/login",
            "/x/%2e./login",
            "/x/%2E%2e/login",
            "/login/%2e",
        ] {
            assert!(is_in("/login", path), "{path}");
        }
        assert!(is_in("/v1/exports", "/v1/%2e/%65xports"));
        // Decoded once, as the decoder does: `%252e` is `%2e`, a name, not a dot.
        assert!(!is_in("/login", "/x/%252e%252e/login"));
        // An encoded slash stays inside its segment: `..%2Flogin` is one segment.
        assert!(!is_in("/login", "/x/..%2Flogin"));
    }

    #[test]
    fn percent_encoded_segments_match_what_they_decode_to() {
        assert!(is_in("/login", "/%6Cogin"));
        assert!(is_in("/login", "/%6c%6F%67%69%6e"));
        assert!(is_in("/users/*/avatar", "/users/%37/%61vatar"));
        assert!(is_in("/api/*", "/%61pi/v1"));
        assert!(!is_in("/login", "/%6Cogins"));
        assert!(!is_in("/login", "/%6C"));
        assert!(!is_in("/a/b", "/a%2Fb"));
        assert!(!is_in("/login", "/%FFogin"));
    }

    #[test]
    fn grpc_method_paths_are_not_dot_segments() {
        assert!(is_in(
            "/helloworld.Greeter/SayHello",
            "/helloworld.Greeter/SayHello"
        ));
        assert!(is_in(
            "/helloworld.Greeter/*",
            "/x/../helloworld.Greeter/./SayHello"
        ));
        assert!(!is_in(
            "/helloworld.Greeter/SayHello",
            "/helloworld.Greeter/SayHello/.."
        ));
    }

    #[test]
    fn patterns_are_normalized_like_paths() {
        assert_eq!(pattern("/v1/./exports/"), ["v1", "exports"]);
        assert_eq!(pattern("//api/x/../*"), ["api", "*"]);
    }

    #[test]
    fn a_path_without_dot_segments_is_matched_as_read() {
        assert!(segments("/v1/exports").all(|segment| dot(segment).is_none()));
        assert!(segments("/helloworld.Greeter/SayHello").all(|segment| dot(segment).is_none()));
        assert!(segments("/%6Cogin/.well-known").all(|segment| dot(segment).is_none()));
    }
}
