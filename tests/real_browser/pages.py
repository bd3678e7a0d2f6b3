"""The pages the browser tier opens, served on 127.0.0.1 by a real HTTP server.

    python3 tests/real_browser/pages.py      # serve them by hand: prints the URL, Ctrl-C stops

- /book.html, the book's three experiments on one page:
  (a) a sidebar of chapter links, translated off-screen when the viewport is
      narrower than 1000 px (a headless browser's is 800), and a toggle,
      #sidebar-toggle, that brings it back;
  (b) a search box, #searchbar, shown by #search-toggle, that searches only on
      a keyup of Enter: inserted text alone finds nothing;
  (c) the search's results, RESULTS links, so that the page has more than 60
      interactive elements (BOOK_TOTAL after a search).
- /chapter-N.html: a chapter, whose title says which;
- /same-links.html: three links alike, so that `a` matches more than one;
- /redirect?to=URL: a 302 to URL;
- /embed?src=URL: a page whose image is URL, a request the page makes itself;
- /picture.png: an image (a PNG of one pixel);
- /later.html: a button, #later, whose click navigates to chapter 3 50 ms later;
- /timer.html: a page that fetches /late a second after it has loaded, and says
  in its title whether that worked;
- /alert.html: a page that opens an alert() as it loads.

Every request is recorded in `requests` (its path), so that a test can tell
whether a page was fetched at all.
"""

from __future__ import annotations

import base64
import html
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHAPTERS = 5
RESULTS = 64
BOOK_TOTAL = CHAPTERS + 2 + 1 + RESULTS  # the sidebar's links, the two toggles, the search box, the results

BOOK = f"""<!doctype html>
<html><head><title>The book</title><style>
  #sidebar {{ position: fixed; top: 0; left: 0; width: 250px; height: 100%; background: #eee; transition: none; }}
  @media (max-width: 1000px) {{ #sidebar {{ transform: translateX(-100%); }} #sidebar.open {{ transform: none; }} }}
  main {{ margin-left: 260px; }}
  #searchbar {{ display: none; }}
  #searchbar.open {{ display: inline; }}
</style></head><body>
<nav id="sidebar">
{"".join(f'<a href="/chapter-{n}.html">Chapter {n}</a><br>' for n in range(1, CHAPTERS + 1))}
</nav>
<main>
<button id="sidebar-toggle" onclick="document.getElementById('sidebar').classList.toggle('open')">Toggle sidebar</button>
<button id="search-toggle" onclick="document.getElementById('searchbar').classList.toggle('open')">Search</button>
<input id="searchbar" placeholder="Search the book">
<div id="results"></div>
</main>
<script>
  const bar = document.getElementById("searchbar");
  bar.addEventListener("keyup", (event) => {{
    if (event.key !== "Enter") return;
    const found = [];
    for (let n = 1; n <= {RESULTS}; n++) found.push(`<a href="/chapter-1.html#r${{n}}">${{bar.value}}: result ${{n}}</a><br>`);
    document.getElementById("results").innerHTML = found.join("");
  }});
</script>
</body></html>"""

PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)

PAGES = {
    "/later.html": """<!doctype html><title>Later</title>
<button id="later" onclick="setTimeout(() => { location.href = '/chapter-3.html'; }, 50)">Go later</button>""",
    "/timer.html": """<!doctype html><title>waiting</title><script>
setTimeout(() => fetch("/late").then(() => { document.title = "fetched"; }, () => { document.title = "refused"; }), 1000);
</script>""",
    "/alert.html": """<!doctype html><title>Alert</title><script>alert("Click OK to go on");</script><p>after</p>""",
}

SAME_LINKS = """<!doctype html><html><head><title>Alike</title></head><body>
<p><a href="/chapter-1.html">more</a></p><p><a href="/chapter-2.html">more</a></p><p><a href="/chapter-3.html">more</a></p>
</body></html>"""


class Pages:
    """The server, on a port of its own; a context manager that stops it."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        pages = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                pages.requests.append(self.path)
                path, _, query = self.path.partition("?")
                if path == "/redirect":
                    self.send_response(302)
                    self.send_header("Location", urllib.parse.parse_qs(query)["to"][0])
                    self.end_headers()
                    return
                if path == "/picture.png":
                    return self.reply(PIXEL, "image/png")
                if path == "/embed":
                    source = html.escape(urllib.parse.parse_qs(query)["src"][0])
                    body = f'<!doctype html><title>Embedded</title><img id="picture" src="{source}">'
                elif path == "/book.html":
                    body = BOOK
                elif path == "/same-links.html":
                    body = SAME_LINKS
                elif path in PAGES:
                    body = PAGES[path]
                elif path.startswith("/chapter-") and path.endswith(".html"):
                    number = path.removeprefix("/chapter-").removesuffix(".html")
                    body = f"<!doctype html><title>Chapter {number}</title><h1>Chapter {number}</h1>"
                else:
                    self.send_error(404)
                    return
                self.reply(body.encode(), "text/html; charset=utf-8")

            def reply(self, data: bytes, kind: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def __enter__(self) -> Pages:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


if __name__ == "__main__":
    with Pages() as served:
        print(f"{served.url}/book.html  (Ctrl-C stops)", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
