"""Email templates: Jinja2 files on disk, rendered when the job runs.

    ROOT/<name>/subject.txt      required
    ROOT/<name>/body.txt         required
    ROOT/<name>/body.html        optional: sent as a text/html alternative
    ROOT/<name>/template.toml    optional: on_unknown = "resend" | "hold"
    ROOT/tenants/<key>/<name>/<file>   overrides that one file for that tenant

Templates run in a sandbox with StrictUndefined (a missing variable is an error, never a
blank); body.html is autoescaped, subject.txt and body.txt are not.

    templates = Templates(Path("templates"))
    rendered = templates.render("welcome", {"user": "Ada"}, tenant_keys=("acme", str(tenant_id)))
    rendered.subject, rendered.text, rendered.html, rendered.version
"""

from __future__ import annotations

import hashlib
import re
import time
import tomllib
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from jinja2 import (
    FileSystemLoader,
    StrictUndefined,
    Template,
    TemplateNotFound,
    TemplateSyntaxError,
    UndefinedError,
    meta,
)
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment

from postrelay.core.errors import PostrelayError, ValidationError

__all__ = ["OnUnknown", "Rendered", "TemplateError", "Templates"]

OnUnknown = Literal["resend", "hold"]
TENANTS = "tenants"  # the folder of per-tenant overrides; not a template name
FILES = ("subject.txt", "body.txt", "body.html", "template.toml")
REQUIRED = ("subject.txt", "body.txt")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
# UTF-8, without the byte order mark some editors write first: kept, it made template.toml
# "Invalid statement (at line 1, column 1)" and began the subject with an invisible U+FEFF.
ENCODING = "utf-8-sig"
# The longest folder name, in bytes, on every common file system: a longer path component
# is not missing but an error (ENAMETOOLONG), which Path.is_dir raises.
NAME_MAX = 255


@dataclass(frozen=True)
class Rendered:
    """One rendered message. `version` is a hash of the files used, as they were read."""

    template: str
    version: str
    subject: str
    text: str
    html: str | None
    on_unknown: OnUnknown
    unsubscribe: bool = False  # bulk mail: carries a one-click unsubscribe link


class TemplateError(PostrelayError):
    """A template cannot be rendered; names the template, the file and the line."""

    def __init__(self, template: str, file: str | None, problem: str,
                 line: int | None = None) -> None:
        self.template, self.file, self.line, self.problem = template, file, line, problem
        where = f", {file}" if file else ""
        where += f" line {line}" if line else ""
        super().__init__(f"template {template!r}{where}: {problem}")


@dataclass(frozen=True)
class _Loaded:
    """A template's files as read from disk, for one tenant's preference order."""

    files: dict[str, Path]
    sources: dict[str, str]
    on_unknown: OnUnknown
    version: str
    until: float  # read again after this (monotonic) time
    unsubscribe: bool = False


class Templates:
    """The templates under `root`, read from disk again `reload_secs` after the last read.

    A template file fixed on disk is used within `reload_secs` (default 1 s), without a
    restart, so replaying a dead-lettered job sends the fixed mail. Compiled templates are
    cached by their source text, and `version` always names the source that was actually
    rendered. `reload_secs=0` reads the files on every render.
    """

    def __init__(self, root: Path, *, reload_secs: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.root = Path(root).absolute()
        self.reload_secs = reload_secs
        self._clock = clock
        self._text_env = self._environment(autoescape=False)
        self._html_env = self._environment(autoescape=True)
        self._compiled: dict[tuple[bool, Path], tuple[str, Template]] = {}
        # A busy worker renders the same template thousands of times a second: reading its
        # files each time (a dozen stats and three reads) cost more than rendering it.
        self._loaded: dict[tuple[str, tuple[str, ...]], _Loaded] = {}
        # The files templates include, import or extend (by a constant name), as last read,
        # and the names each source refers to (parsing is not free; sources rarely change).
        self._includes: dict[str, str] = {}
        self._references: dict[str, tuple[str, ...]] = {}

    def names(self) -> list[str]:
        """The templates at the root (folders holding a subject.txt), sorted."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir()
                      if p.name != TENANTS and _NAME.fullmatch(p.name)
                      and (p / "subject.txt").is_file())

    def policy(self, name: str, *, tenant_keys: Sequence[str] = ()) -> OnUnknown:
        """What to do when a crashed worker left this template's message outcome unknown."""
        return self._load(name, tenant_keys).on_unknown

    def render(self, name: str, context: Mapping[str, Any], *,
               tenant_keys: Sequence[str] = ()) -> Rendered:
        """Render `name` with `context`, preferring the files of the first tenant key that
        has them (e.g. `tenant_keys=("acme", str(tenant_id))`)."""
        loaded = self._load(name, tenant_keys)
        files, sources = loaded.files, loaded.sources
        values = dict(context)
        subject = self._run(name, self._text_env, files["subject.txt"], sources["subject.txt"],
                            values)
        text = self._run(name, self._text_env, files["body.txt"], sources["body.txt"], values)
        html = None
        if "body.html" in files:
            html = self._run(name, self._html_env, files["body.html"], sources["body.html"],
                             values)
        return Rendered(template=name, version=loaded.version, subject=subject.strip(),
                        text=text, html=html, on_unknown=loaded.on_unknown,
                        unsubscribe=loaded.unsubscribe)

    def _load(self, name: str, tenant_keys: Sequence[str]) -> _Loaded:
        key = (name, tuple(tenant_keys))
        now = self._clock()
        loaded = self._loaded.get(key)
        if loaded is not None and now < loaded.until:
            return loaded
        files = self._resolve(name, tenant_keys)
        sources = {file: self._read(name, path) for file, path in files.items()}
        on_unknown, unsubscribe = self._policy(name, files.get("template.toml"),
                                               sources.get("template.toml"))
        digest = hashlib.sha256()
        for file, path in files.items():  # FILES order, so the hash is stable
            digest.update(f"{self._rel(path)}\0{len(sources[file])}\0".encode())
            digest.update(sources[file].encode())
        for include, source in self._included(sources):  # files used too: in the version
            digest.update(f"{include}\0{len(source)}\0".encode())
            digest.update(source.encode())
        loaded = _Loaded(files, sources, on_unknown, digest.hexdigest()[:12],
                         now + self.reload_secs, unsubscribe)
        if self.reload_secs > 0:
            self._loaded[key] = loaded
        return loaded

    def _included(self, sources: Mapping[str, str]) -> list[tuple[str, str]]:
        """(name, text) of each file the templates in `sources` include, import or extend,
        and those include, by name. Jinja reloads such a file only when its mtime changes:
        one rewritten within the same tick was rendered as it was before, so a change seen
        here empties the compiled includes. One missing or broken is the render's to report,
        and one named by a variable is not known before the render."""
        loader = self._text_env.loader
        assert loader is not None
        found: dict[str, str] = {}
        pending = [text for file, text in sources.items() if file != "template.toml"]
        while pending:
            for name in self._referenced(pending.pop()):
                if name in found:
                    continue
                try:
                    found[name] = loader.get_source(self._text_env, name)[0]
                except (TemplateNotFound, OSError, UnicodeDecodeError):
                    continue
                pending.append(found[name])
        if any(self._includes.get(name, text) != text for name, text in found.items()):
            for env in (self._text_env, self._html_env):
                if env.cache is not None:
                    env.cache.clear()
        self._includes.update(found)
        return sorted(found.items())

    def _referenced(self, source: str) -> tuple[str, ...]:
        names = self._references.get(source)
        if names is None:
            try:
                parsed = self._text_env.parse(source)
                names = tuple(n for n in meta.find_referenced_templates(parsed) if n)
            except TemplateSyntaxError:
                names = ()
            if len(self._references) >= 1024:
                self._references.clear()
            self._references[source] = names
        return names

    def _environment(self, *, autoescape: bool) -> SandboxedEnvironment:
        # The loader serves {% include %} and {% extends %}; auto_reload re-reads those when
        # their mtime changes. The top-level files are compiled from the text read in render().
        return ImmutableSandboxedEnvironment(
            loader=FileSystemLoader(self.root, encoding=ENCODING), auto_reload=True,
            undefined=StrictUndefined, autoescape=autoescape, trim_blocks=True,
            lstrip_blocks=True)

    def _resolve(self, name: str, tenant_keys: Sequence[str]) -> dict[str, Path]:
        check_template_name(name)
        # A tenant key that cannot be a folder name (a '/' in a tenant's name) just has no
        # overrides: it must not reach outside the templates folder.
        folders = [self.root / TENANTS / key / name for key in tenant_keys if _safe_key(key)]
        folders.append(self.root / name)
        if not any(folder.is_dir() for folder in folders):
            raise TemplateError(name, None, f"unknown template (no folder {name}/ in {self.root})")
        files = {}
        for file in FILES:
            found = next((f / file for f in folders if (f / file).is_file()), None)
            if found is not None:
                files[file] = found
            elif file in REQUIRED:
                raise TemplateError(name, file, "missing (every template needs subject.txt "
                                                "and body.txt)")
        return files

    def _read(self, name: str, path: Path) -> str:
        try:
            return path.read_text(encoding=ENCODING)
        except (OSError, UnicodeDecodeError) as exc:
            raise TemplateError(name, self._rel(path), f"cannot be read: {exc}") from exc

    def _policy(self, name: str, path: Path | None, source: str | None
                ) -> tuple[OnUnknown, bool]:
        if path is None or source is None:
            return "resend", False
        rel = self._rel(path)
        try:
            data = tomllib.loads(source)
        except tomllib.TOMLDecodeError as exc:
            raise TemplateError(name, rel, f"not valid TOML: {exc}") from exc
        unknown = sorted(set(data) - {"on_unknown", "unsubscribe"})
        if unknown:
            raise TemplateError(name, rel, f"unknown key {', '.join(unknown)} "
                                           "(the keys are on_unknown and unsubscribe)")
        unsubscribe = data.get("unsubscribe", False)
        if not isinstance(unsubscribe, bool):
            raise TemplateError(name, rel, f"unsubscribe must be true or false, not "
                                           f"{unsubscribe!r}")
        value = data.get("on_unknown", "resend")
        if value not in ("resend", "hold"):
            raise TemplateError(name, rel, f"on_unknown must be 'resend' or 'hold', not {value!r}")
        return cast(OnUnknown, value), unsubscribe

    def _run(self, name: str, env: SandboxedEnvironment, path: Path, source: str,
             context: dict[str, Any]) -> str:
        try:
            return self._compile(env, path, source).render(context)
        except TemplateSyntaxError as exc:
            file = self._rel(Path(exc.filename)) if exc.filename else self._rel(path)
            raise TemplateError(name, file, f"syntax error: {exc.message}", exc.lineno) from exc
        except Exception as exc:  # undefined variable, sandbox refusal, a failing filter
            file, line = self._where(exc, path)
            raise TemplateError(name, file, _describe(exc), line) from exc

    def _compile(self, env: SandboxedEnvironment, path: Path, source: str) -> Template:
        key = (bool(env.autoescape), path)
        cached = self._compiled.get(key)
        if cached is not None and cached[0] == source:
            return cached[1]
        # What Environment.from_string does, plus a name and a filename for error messages.
        code = env.compile(source, name=self._rel(path), filename=str(path))
        # A plain dict of the environment's globals, not the ChainMap make_globals returns:
        # every render copies the globals into a new context, and copying a ChainMap was
        # most of the cost of rendering a short template. Nothing changes them after start.
        template = env.template_class.from_code(env, code, dict(env.make_globals(None)))
        self._compiled[key] = (source, template)
        return template

    def _where(self, exc: BaseException, default: Path) -> tuple[str, int | None]:
        # Jinja rewrites the traceback so that template frames carry the template's file
        # name and line; the innermost one under the root is where the template failed.
        for frame in reversed(traceback.extract_tb(exc.__traceback__)):
            if Path(frame.filename).is_relative_to(self.root):
                return self._rel(Path(frame.filename)), frame.lineno
        return self._rel(default), None

    def _rel(self, path: Path) -> str:
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            return str(path)


def check_template_name(name: object) -> None:
    """Raise ValidationError (`template`) unless `name` can name a template's folder."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name \
            or name == TENANTS:
        raise ValidationError("template", f"{name!r} is not a template name (letters, "
                                          "digits, '_', '-', '.'; no path)")
    if len(name) > NAME_MAX:  # ASCII: as many bytes as characters
        raise ValidationError("template", f"must be at most {NAME_MAX} characters (a "
                                          f"folder name), got {len(name)}")


def _safe_key(key: str) -> bool:
    """Whether `key` can be a folder name: a tenant's name of 90 CJK characters (270 bytes
    in UTF-8) cannot, and looking for its folder stopped every message of the tenant."""
    return (isinstance(key, str) and bool(key) and not key.startswith(".")
            and not any(c in key for c in "/\\\0")
            and len(key.encode("utf-8", "surrogatepass")) <= NAME_MAX)


def _describe(exc: Exception) -> str:
    if isinstance(exc, UndefinedError):
        return f"undefined variable: {exc}"
    if isinstance(exc, SecurityError):
        return f"refused by the sandbox: {exc}"
    return f"{type(exc).__name__}: {exc}"
