"""Chapter 30: the browser tool (exercises/ex30/agent.py), without a browser.

The tool speaks CDP, JSON-RPC over one websocket, through websockets' sync client.
Its client class, CDP, is driven here in-process against tests/fake_cdp.py, a fake
DevTools endpoint on 127.0.0.1 built on websockets' own server: answers routed to
their callers by id in whatever order they come, protocol errors raised as
"Method: cdp error code: message", events handed to a handler (which may wake the
waiting caller), a lost or closed connection waking every caller, and an answer
that comes after its caller gave up dropped. /json/version names the websocket of
a browser BROWSER_CDP_URL points at.

The rest runs the program against the fake provider: the argument checks that come
before any browser starts (the url of navigate only, http and https only, the key
list, what each action needs), websockets missing, no browser on PATH, -sandbox,
the round cap of 30, the tool withheld from subagents, and attaching to someone's
own browser (the fake endpoint), where every action asks, the exit closes our tab
and nothing else, screenshots are kept private and at most 20, and Ctrl-C wakes an
action that waits. What a real Chromium does is tests/real_browser/.
"""

from __future__ import annotations

import base64
import json
import re
import stat
import threading
import time
from collections.abc import Callable, Iterator
from types import ModuleType

import pytest
from fake_cdp import CLOSE, FakeCDP, failure, result
from fake_cdp import answer as browser_answer
from resident import Resident

from conftest import run_agent
from fake_provider import text, tool_call
from helpers import calls, free_port, results, session_file, tool_names

PROGRAMS = [30, "final"]
each = pytest.mark.parametrize("chapter", PROGRAMS)
unit = pytest.mark.parametrize("loaded", PROGRAMS, indirect=True)

QUESTION = "allow? (y/N) "
STARTED = "[browser started ("
PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 24  # enough of one for a file to start as a PNG does


def browser_calls(*actions: dict) -> list:
    """One round per action, each its own tool call b1, b2, ...; then a last answer."""
    return [calls((f"b{n}", "browser", args)) for n, args in enumerate(actions, start=1)] + [text("done")]


# ---------------------------------------------------------------- the CDP client, in-process


@pytest.fixture
def connect(loaded: ModuleType) -> Iterator[Callable[..., object]]:
    """connect(fake, on_event=None) opens the program's CDP client on a fake endpoint; all are closed after."""
    opened = []

    def open_client(fake: FakeCDP, on_event: Callable[[dict], None] | None = None) -> object:
        opened.append(loaded.CDP(fake.ws_url, on_event or (lambda event: None)))
        return opened[-1]

    yield open_client
    for client in opened:
        client.close()


def soon(seconds: float = 10) -> float:
    return time.monotonic() + seconds


@unit
def test_answers_reach_their_callers_by_id_in_whatever_order_they_come(loaded, connect) -> None:
    held: list[dict] = []

    def reverse(call: dict, connection: object) -> list:
        held.append(call)  # three calls at once, answered last first
        return [result(c, {"method": c["method"]}) for c in reversed(held)] if len(held) == 3 else []

    with FakeCDP(reverse) as fake:
        client = connect(fake)
        got: dict[str, dict] = {}
        threads = [
            threading.Thread(target=lambda n=n: got.update({n: client.call(f"Test.call{n}", deadline=soon())}))
            for n in range(3)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(15)
        assert got == {n: {"method": f"Test.call{n}"} for n in range(3)}
        assert sorted(call["id"] for call in fake.received) == [1, 2, 3]  # the ids count up
        assert client.pending == {}


@unit
def test_a_protocol_error_is_raised_with_its_method_code_and_message(loaded, connect) -> None:
    with FakeCDP(lambda call, connection: [failure(call, -32601, "'Nope.nope' wasn't found")]) as fake:
        with pytest.raises(loaded.CDPError) as raised:
            connect(fake).call("Nope.nope", deadline=soon())
        assert str(raised.value) == "Nope.nope: cdp error -32601: 'Nope.nope' wasn't found"


@unit
def test_events_go_to_the_handler_and_frames_that_are_neither_are_skipped(loaded, connect) -> None:
    def noisy(call: dict, connection: object) -> list:
        events = [{"method": "Page.lifecycleEvent", "params": {"n": n}} for n in range(20)]
        junk = ["not json", "[1, 2]", json.dumps({"params": {}}), json.dumps({"id": 999, "result": {}})]
        return [*events, *junk, result(call, {"ok": True})]

    seen: list[dict] = []
    with FakeCDP(noisy) as fake:
        client = connect(fake, seen.append)
        assert client.call("Page.enable", deadline=soon()) == {"ok": True}
        assert [event["params"]["n"] for event in seen] == list(range(20))
        assert client.call("Page.enable", deadline=soon()) == {"ok": True}  # it still reads
        assert len(seen) == 40


@unit
def test_an_event_handler_can_wake_the_waiting_caller_which_runs_its_idle_hook(loaded, connect) -> None:
    """How the browser decides a paused request in the thread that runs the action."""

    def paused_first(call: dict, connection: object) -> list:
        return [{"method": "Fetch.requestPaused", "params": {"requestId": "r1"}}, result(call)]

    idled: list[int] = []
    with FakeCDP(paused_first) as fake:
        client = connect(fake, lambda event: client.wake())
        client.idle = lambda: idled.append(threading.get_ident())
        client.call("Page.navigate", deadline=soon())
        assert len(idled) >= 2  # once before it waits, once more when the event woke it
        assert set(idled) == {threading.get_ident()}  # in the caller's thread, not the reader's


@unit
def test_a_lost_connection_wakes_every_waiting_caller(loaded, connect) -> None:
    held: list[dict] = []

    def hang_up(call: dict, connection: object) -> list:
        held.append(call)
        return [CLOSE] if len(held) == 2 else []

    with FakeCDP(hang_up) as fake:
        client = connect(fake)
        errors: list[str] = []

        def wait() -> None:
            try:
                client.call("Runtime.evaluate", deadline=soon(60))
            except loaded.CDPError as error:
                errors.append(str(error))

        started = time.monotonic()
        threads = [threading.Thread(target=wait) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert errors == ["Runtime.evaluate: the connection to the browser was lost"] * 2
        assert time.monotonic() - started < 20  # woken, not timed out at 60 s
        with pytest.raises(loaded.CDPError, match="was lost"):
            client.call("Page.enable", deadline=soon())  # and nothing more is sent


@unit
def test_close_wakes_a_caller_that_waits(loaded, connect) -> None:
    with FakeCDP(lambda call, connection: []) as fake:
        client = connect(fake)
        errors: list[str] = []

        def wait() -> None:
            try:
                client.call("Runtime.evaluate", deadline=soon(60))
            except loaded.CDPError as error:
                errors.append(str(error))

        thread = threading.Thread(target=wait)
        thread.start()
        fake.wait_calls(1)
        client.close()
        thread.join(20)
        assert errors == ["Runtime.evaluate: the browser was closed"]


@unit
def test_an_answer_that_comes_after_its_caller_gave_up_is_dropped(loaded, connect) -> None:
    held: list[dict] = []

    def late(call: dict, connection: object) -> list:
        held.append(call)
        if len(held) == 1:
            return []  # the first waits; its answer comes just before the second's
        return [result(held[0], {"which": "first"}), result(call, {"which": "second"})]

    with FakeCDP(late) as fake:
        client = connect(fake)
        with pytest.raises(loaded.CDPError, match="no answer from the browser in time"):
            client.call("Runtime.evaluate", deadline=time.monotonic() + 0.3)
        assert client.call("Runtime.evaluate", deadline=soon()) == {"which": "second"}
        assert client.pending == {}


@unit
def test_browser_cdp_url_is_a_websocket_or_asked_for_it_at_json_version(loaded) -> None:
    with FakeCDP() as fake:
        assert loaded.devtools_url(fake.http_url, soon()) == fake.ws_url
        assert loaded.devtools_url(fake.http_url + "/", soon()) == fake.ws_url
        assert loaded.devtools_url(fake.ws_url, soon()) == fake.ws_url
    with pytest.raises(loaded.CDPError, match=r"no browser answers at .* --remote-debugging-port=9222"):
        loaded.devtools_url(f"http://127.0.0.1:{free_port()}", soon())
    with pytest.raises(loaded.CDPError, match="a ws:// URL or http://host:port"):
        loaded.devtools_url("file:///tmp/x", soon())


# ---------------------------------------------------------------- the tool, before a browser starts


@each
def test_arguments_are_checked_before_any_browser_starts(provider, workdir, chapter) -> None:
    provider.script(
        *browser_calls(
            {"action": "observe", "url": "https://example.com/"},
            {"action": "scroll"},
            {"action": "click"},
            {"action": "type", "selector": "#q"},
            {"action": "key", "keys": "F5"},
            {"action": "eval", "js": "  "},
            {"action": "navigate", "url": "file:///etc/passwd"},
            {"action": "navigate", "url": "javascript:alert(1)"},
            {"action": "navigate", "url": "data:text/html,<h1>hi</h1>"},
            {"action": "navigate", "url": "chrome://settings"},
            {"action": "navigate", "url": "http://[::1"},
        )
    )
    empty = workdir.parent / "empty-path"
    empty.mkdir()
    done = run_agent(chapter, "Use the browser", provider=provider, cwd=workdir, PATH=str(empty))
    assert done.returncode == 0, done.stderr
    only_web = "error: only http and https URLs can be opened (not file:, javascript:, data: or chrome:)"
    assert results(provider) == {
        "b1": "error: url belongs to navigate: navigate to it first, then call observe without url",
        "b2": "error: unknown action 'scroll'; the actions are: navigate, observe, click, type, key, eval, screenshot",
        "b3": "error: click needs selector",
        "b4": "error: type needs text",
        "b5": "error: unknown key 'F5'; the keys are: enter, escape, tab, backspace, space, arrowdown, arrowup",
        "b6": "error: eval needs js",
        "b7": only_web,
        "b8": only_web,
        "b9": only_web,
        "b10": only_web,
        "b11": "error: 'http://[::1' is not a URL: Invalid IPv6 URL",
    }
    assert STARTED not in done.stderr


@each
def test_the_model_is_told_the_actions_and_their_arguments(provider, workdir, chapter) -> None:
    provider.script(text("ok"))
    run_agent(chapter, "Hi", provider=provider, cwd=workdir)
    tool = next(t["function"] for t in provider.chat_requests[0]["tools"] if t["function"]["name"] == "browser")
    parameters = tool["parameters"]
    assert parameters["required"] == ["action"]
    assert parameters["properties"]["action"]["enum"] == [
        "navigate", "observe", "click", "type", "key", "eval", "screenshot"
    ]  # fmt: skip
    assert set(parameters["properties"]) == {"action", "url", "selector", "text", "keys", "js"}
    assert "observe first" in tool["description"] and "web_fetch" in tool["description"]


@each
def test_without_websockets_the_tool_says_what_to_install(provider, workdir, chapter) -> None:
    shadow = workdir.parent / "no-websockets" / "websockets"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('websockets is not installed')\n")
    provider.script(*browser_calls({"action": "observe"}))
    done = run_agent(chapter, "Look", provider=provider, cwd=workdir, PYTHONPATH=str(shadow.parent))
    assert done.returncode == 0, done.stderr
    assert results(provider)["b1"] == "error: browser: the browser needs the websockets library: pip install websockets"
    assert STARTED not in done.stderr


@each
def test_without_a_browser_on_path_the_tool_says_what_to_install(provider, workdir, chapter) -> None:
    empty = workdir.parent / "empty-path"
    empty.mkdir()
    provider.script(*browser_calls({"action": "observe"}))
    done = run_agent(chapter, "Look", provider=provider, cwd=workdir, PATH=str(empty))
    assert done.returncode == 0, done.stderr
    assert results(provider)["b1"] == (
        "error: browser: no browser on PATH (none of chromium, chromium-browser, google-chrome, "
        "google-chrome-stable, headless_shell): install Chromium: apt-get install chromium"
    )
    assert STARTED not in done.stderr


@each
def test_under_sandbox_the_browser_refuses(provider, workdir, chapter) -> None:
    provider.script(*browser_calls({"action": "navigate", "url": "https://example.com/"}))
    done = run_agent(chapter, "-sandbox", "Open it", provider=provider, cwd=workdir)
    if "[sandbox on: " not in done.stderr:
        pytest.skip(f"this machine cannot sandbox: {done.stderr.strip().splitlines()[-1]}")
    assert results(provider)["b1"] == (
        "error: the browser is off under -sandbox: the network is off, and a browser would be outside the cage"
    )
    assert STARTED not in done.stderr


@each
def test_a_turn_may_take_30_rounds(provider, workdir, chapter) -> None:
    rounds = 50 if chapter == "final" else 30  # agent.py's default, which MAX_ROUNDS changes
    provider.script(*[calls((f"c{n}", "browser", {"action": "scroll"})) for n in range(rounds + 1)])
    done = run_agent(chapter, "Browse on and on", provider=provider, cwd=workdir)
    assert done.returncode == 1
    assert f"stopped: reached the {rounds}-round limit" in done.stderr
    assert len(provider.chat_requests) == rounds


@each
def test_a_subagent_has_no_browser(provider, workdir, chapter) -> None:
    provider.script(
        tool_call("sub_agent", {"description": "look", "prompt": "Look around"}),
        text("nothing to see"),
        text("done"),
    )
    done = run_agent(chapter, "Delegate", provider=provider, cwd=workdir)
    assert done.returncode == 0, done.stderr
    parent, child = provider.chat_requests[0], provider.chat_requests[1]
    assert "browser" in tool_names(parent) and tool_names(parent).index("browser") > tool_names(parent).index(
        "sub_agent"
    )
    assert "browser" not in tool_names(child)


# ---------------------------------------------------------------- someone's own browser: BROWSER_CDP_URL


@each
def test_attached_every_action_asks_and_the_exit_closes_only_our_tab(provider, workdir, chapter) -> None:
    with FakeCDP() as fake:
        provider.script(*browser_calls({"action": "eval", "js": "1 + 1"}, {"action": "eval", "js": "document.cookie"}))
        done = run_agent(
            chapter, "Count", provider=provider, cwd=workdir, answers="y\nn\n", BROWSER_CDP_URL=fake.http_url
        )
        assert done.returncode == 0, done.stderr
        got = results(provider)
        assert got["b1"].startswith('<untrusted_web_content kind="browser page" source="http://page.test/">\n')
        assert got["b1"].endswith(")\n2\n</untrusted_web_content>")
        assert got["b2"] == "error: permission denied — the user did not approve this browser action"
        assert done.terminal.count(QUESTION) == 2
        assert 'the model wants to act in your own browser: {"action": "eval", "js": "1 + 1"}' in done.terminal
        assert f"[browser started (attached to {fake.http_url}); it opened a tab of its own]" in done.stderr
        received = fake.received
    methods = [call["method"] for call in received]
    evaluated = [call["params"]["expression"] for call in received if call["method"] == "Runtime.evaluate"]
    assert "document.cookie" not in evaluated  # the one refused never reached the browser
    assert "Browser.setDownloadBehavior" not in methods  # the browser is someone's: nothing of it is changed
    fetch = [call for call in received if call["method"] == "Fetch.enable"]
    assert [call.get("sessionId") for call in fetch] == ["S1"]  # our tab's requests only
    assert methods[-1] == "Target.closeTarget" and received[-1]["params"] == {"targetId": "T1"}
    assert "Browser.close" not in methods


@each
def test_screenshots_are_private_and_only_the_newest_20_are_kept(provider, workdir, chapter) -> None:
    def screenshot(call: dict, connection: object) -> list:
        if call["method"] == "Page.captureScreenshot":
            return [result(call, {"data": base64.b64encode(PNG).decode()})]
        return browser_answer(call, connection)

    with FakeCDP(screenshot) as fake:
        provider.script(*browser_calls(*[{"action": "screenshot"}] * 21))
        done = run_agent(
            chapter, "Shoot", provider=provider, cwd=workdir, answers="y\n" * 21, BROWSER_CDP_URL=fake.http_url
        )
    assert done.returncode == 0, done.stderr
    directory = session_file(workdir, done.stderr).with_suffix("") / "screenshots"
    shots = sorted(directory.iterdir())
    assert len(shots) == 20 and all(shot.read_bytes() == PNG for shot in shots)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(directory.parent.stat().st_mode) == 0o700
    assert {stat.S_IMODE(shot.stat().st_mode) for shot in shots} == {0o600}
    got = results(provider)
    first = re.fullmatch(
        r"saved a screenshot of the viewport \(32 bytes\) to (\S+)\. You cannot see images: .*", got["b1"]
    )
    assert first and not (workdir / first.group(1)).exists()  # the oldest, removed by the 21st
    assert got["b21"].endswith(
        "; the oldest 1 removed, 20 are kept. You cannot see images: use observe or eval to read the page"
    )
    assert (workdir / got["b21"].split(" to ")[1].split(";")[0]) == shots[-1]


@each
def test_ctrl_c_wakes_an_action_that_waits_for_the_browser(provider, workdir, chapter) -> None:
    def hold_evaluate(call: dict, connection: object) -> list:
        if call["method"] == "Runtime.evaluate" and call["params"]["expression"] == "new Promise(() => {})":
            return []  # a promise that never settles: the action waits for the browser
        return browser_answer(call, connection)

    with FakeCDP(hold_evaluate) as fake:
        provider.script(*browser_calls({"action": "eval", "js": "new Promise(() => {})"}), text("back"))
        terminal = Resident(chapter, provider=provider, cwd=workdir, BROWSER_CDP_URL=fake.http_url)
        try:
            terminal.wait_prompt(1)
            terminal.line("Wait for it")
            terminal.wait_for(QUESTION)
            terminal.line("y")
            deadline = time.monotonic() + 20
            while "new Promise(() => {})" not in [c["params"].get("expression") for c in fake.received]:
                assert time.monotonic() < deadline, fake.received
                time.sleep(0.05)
            pressed = time.monotonic()
            terminal.type("\x03")
            terminal.wait_for("[turn interrupted; the conversation is kept]")
            assert time.monotonic() - pressed < 10  # woken, not the 45 s of the action
            terminal.wait_prompt(2)
            terminal.line("/exit")
            assert terminal.wait_exit() == 0
        finally:
            terminal.close()
        assert fake.methods()[-1] == "Target.closeTarget"
    stored = [json.loads(line) for line in session_file(workdir, terminal.text).read_text().splitlines()]
    tool_results = [
        r["message"]["content"] for r in stored if r.get("type") == "message" and r["message"]["role"] == "tool"
    ]
    assert tool_results == ["error: browser: Runtime.evaluate: interrupted by the user"]
