// The web page of `lightseg serve` (internal): served at GET /.
#pragma once

#include <string>

namespace lightseg {

// HTML, CSS and JavaScript in one self-contained document.
const std::string& web_page_html();

// The Content-Security-Policy it is served with: its own inline script and style, pictures from
// data: and blob: URLs, requests to this origin only, and no framing by any page.
inline constexpr const char* kPagePolicy =
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data: blob:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

}  // namespace lightseg
