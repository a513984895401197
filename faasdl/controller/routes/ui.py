"""The dashboard: ``GET /ui``, one server-rendered page and one small script (no build step).

The page holds no data and needs no key: the script asks for an API key once, keeps it in the
browser's session storage, and reads everything through the API with it (``/v1/jobs``, a job's
view and ledger, and its event stream, which it follows with ``fetch`` because an EventSource
cannot send a bearer token). Assets are served with a content hash in their URL, so that they are
cached for good and a new release is fetched at once; the page itself is never cached."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from string import Template

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.responses import HTMLResponse

from faasdl import __version__

#: The assets the page loads, and their media types.
ASSETS = {"dashboard.js": "text/javascript; charset=utf-8", "dashboard.css": "text/css"}
#: Only the controller's own script and style; no inline code, no other origin.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
PAGE_HEADERS = {
    "Cache-Control": "no-cache",
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

PAGE = Template("""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>faasdl dashboard</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/ui/static/dashboard.css?v=$css">
<script src="/ui/static/dashboard.js?v=$js" defer></script>
</head>
<body data-auth="$auth">
<header>
  <h1><a href="#">faasdl</a> <span class="version">$version</span></h1>
  <form id="key-form" autocomplete="off">
    <label for="api-key">API key</label>
    <input id="api-key" name="api-key" type="password" spellcheck="false"
           placeholder="fdl_…" aria-describedby="key-status">
    <button type="submit">Use key</button>
    <button type="button" id="forget-key">Forget key</button>
    <span id="key-status" role="status"></span>
  </form>
</header>
<main>
  <section id="jobs-view" aria-labelledby="jobs-title">
    <h2 id="jobs-title">Jobs</h2>
    <form id="job-filter" role="search" aria-label="Filter the jobs">
      <label for="filter-name">Name holds</label>
      <input id="filter-name" type="search" maxlength="100" spellcheck="false"
             placeholder="lr sweep">
      <label for="filter-state">State</label>
      <select id="filter-state">
        <option value="">any</option><option>queued</option><option>running</option>
        <option>done</option><option>failed</option><option>cancelled</option>
      </select>
    </form>
    <table id="jobs">
      <caption>Newest first; choose a job to follow it live.</caption>
      <thead><tr>
        <th scope="col">Job</th><th scope="col">State</th><th scope="col">Tenant</th>
        <th scope="col">Progress</th><th scope="col">Loss</th><th scope="col">Accuracy</th>
        <th scope="col">Cost (USD)</th><th scope="col">Created</th>
      </tr></thead>
      <tbody></tbody>
    </table>
  </section>
  <section id="job-view" aria-labelledby="job-title" hidden>
    <h2 id="job-title">Job</h2>
    <dl id="job-summary"></dl>
    <p id="job-model" hidden>
      <button type="button" id="download-model">Download the model</button>
      <span id="model-note"></span>
      <span id="model-progress" role="status"></span>
    </p>
    <h3 id="lanes-title">Units</h3>
    <p class="legend" aria-hidden="true">
      <span class="key wait"></span> queue wait <span class="key init"></span> cold start
      <span class="key run"></span> training <span class="key running"></span> running
      <span class="mark checkpoint">◆</span> checkpoint <span class="mark failure">✕</span> failure
      <span class="mark stopped">▮</span> stopped (its job cancelled or failed)
      <span class="mark commit">✓</span> commit
      <span class="mark replica">R</span> on a warm replica
    </p>
    <div id="lanes" role="img" aria-labelledby="lanes-title" tabindex="0"></div>
    <h3 id="curves-title">Loss and accuracy per round</h3>
    <div id="curves" role="img" aria-labelledby="curves-title" tabindex="0"></div>
    <h3>Memory: estimate against measured peak</h3>
    <table id="memory">
      <thead><tr>
        <th scope="col">Action</th><th scope="col">Estimate (MB)</th>
        <th scope="col">Limit (MB)</th><th scope="col">Measured peak (MB)</th>
        <th scope="col">Activations</th>
      </tr></thead>
      <tbody></tbody>
    </table>
    <h3>Warm replicas</h3>
    <p id="replicas">none</p>
    <h3>Events</h3>
    <ol id="events" aria-live="polite" aria-label="Events" tabindex="0"></ol>
  </section>
</main>
</body>
</html>
""")


@dataclass(frozen=True)
class _Asset:
    body: bytes
    media_type: str
    digest: str  # also the asset's ETag and the version in its URL


def _assets() -> dict[str, _Asset]:
    found = {}
    for name, media_type in ASSETS.items():
        body = (resources.files("faasdl.controller") / "static" / name).read_bytes()
        found[name] = _Asset(body, media_type, hashlib.sha256(body).hexdigest()[:16])
    return found


def router(*, auth: str) -> APIRouter:
    """The dashboard's routes (outside the API's schema: a page, not an endpoint); ``auth`` is
    the API's (``none``: the page asks for no key)."""
    assets = _assets()
    page = PAGE.substitute(
        version=__version__,
        js=assets["dashboard.js"].digest,
        css=assets["dashboard.css"].digest,
        auth=auth,
    )
    routes = APIRouter(include_in_schema=False)

    @routes.get("/ui", response_class=HTMLResponse)
    async def dashboard() -> HTMLResponse:
        return HTMLResponse(page, headers=PAGE_HEADERS)

    @routes.get("/ui/static/{name}")
    async def asset(name: str, request: Request) -> Response:
        found = assets.get(name)
        if found is None:
            raise HTTPException(404, f"no asset {name!r}")
        etag = f'"{found.digest}"'
        headers = {
            "ETag": etag,
            "Cache-Control": "public, max-age=31536000, immutable",
            "X-Content-Type-Options": "nosniff",
        }
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers=headers)
        return Response(found.body, media_type=found.media_type, headers=headers)

    return routes
