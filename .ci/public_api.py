#!/usr/bin/env python3
"""Render the public API of the workspace's published library crates from
rustdoc's JSON output, one sorted line per public path, so that a change of
surface is a readable diff.

Usage: public_api.py DOC_DIR OUT_DIR CRATE...
  DOC_DIR  the folder holding `<crate_name>.json` (cargo's target/doc)
  OUT_DIR  where to write `<crate>.txt`, one per CRATE (package names)

What is listed: every item reachable from the crate root through public
modules and `pub use` re-exports (globs included, explicit names shadowing
glob ones), under every path it is reachable by (an item with two public
homes shows twice: that is the point), with its kind and signature; the
public fields, variants, inherent methods and associated items of types and
traits; the trait impls of each type, auto traits included, blanket impls left
out (they follow from the trait's bounds); and impls of the crate's traits
for foreign or generic types. `#[doc(hidden)]` items are not listed (rustdoc
strips them). A re-export of another workspace crate is followed into that
crate's JSON; a re-export of any other crate is one `pub use` line.

Types in signatures are written with their public path: the shortest path by
which the defining workspace crate exposes them, or the path rustdoc records
for items of other crates (`core::option::Option`).

Counts per crate go to stdout (see `summary`).
"""

import json
import os
import sys

# The rustdoc JSON format this script was written against. Another version
# is tried anyway (the fields used here rarely change); a failure then says so.
KNOWN_FORMAT_VERSIONS = {57}

TYPE_NS = {"module", "struct", "enum", "union", "trait", "trait_alias", "type_alias", "extern_type"}
VALUE_NS = {"function", "constant", "static"}
MACRO_NS = {"macro", "proc_macro"}
# The auto traits a user can name on stable Rust; rustdoc also lists unstable
# ones (`Freeze`, `UnsafeUnpin`) that no user can depend on.
STABLE_AUTO_TRAITS = {"Send", "Sync", "Unpin", "UnwindSafe", "RefUnwindSafe"}
# Marker traits a derive implements that no user can name on stable Rust.
UNSTABLE_MARKERS = {"StructuralPartialEq"}
DECLARATION_KINDS = {
    "module", "struct", "enum", "union", "trait", "trait_alias", "type_alias",
    "function", "constant", "static", "macro", "proc_macro",
}


def kind_of(item):
    return next(iter(item["inner"]))


def namespace(kind):
    if kind in MACRO_NS:
        return "macro"
    if kind in VALUE_NS:
        return "value"
    return "type"


class Crate:
    """One crate's rustdoc JSON."""

    def __init__(self, package, data):
        self.package = package
        self.data = data
        self.name = data["index"][str(data["root"])]["name"]
        self.index = data["index"]
        self.paths = data["paths"]
        self.external = data["external_crates"]
        # def path (as rustdoc records it, private modules included) -> local id
        self.by_def_path = {
            tuple(p["path"]): int(i) for i, p in self.paths.items() if p["crate_id"] == 0
        }
        # local id -> every public path found by the walk
        self.public_paths = {}

    def item(self, id_):
        return self.index.get(str(id_))


class Api:
    def __init__(self, crates):
        self.crates = crates  # crate name -> Crate
        self.warnings = []

    # ---- resolution -------------------------------------------------------

    def resolve(self, crate, id_):
        """(Crate, local id) of an id seen in `crate`, or None when it lies
        in a crate whose JSON is not loaded (std, dependencies)."""
        if id_ is None:
            return None
        item = crate.item(id_)
        if item is not None and item["crate_id"] == 0:
            return crate, id_
        entry = crate.paths.get(str(id_))
        if entry is None:
            return None
        if entry["crate_id"] == 0:
            return (crate, id_) if item is not None else None
        ext = crate.external.get(str(entry["crate_id"]))
        if ext is None:
            return None
        target = self.crates.get(ext["name"])
        if target is None:
            return None
        local = target.by_def_path.get(tuple(entry["path"]))
        if local is None:
            self.warnings.append(
                f"{crate.name}: cannot find {'::'.join(entry['path'])} in {target.name}'s JSON"
            )
            return None
        return target, local

    def foreign_path(self, crate, id_, fallback):
        """The path rustdoc records for an item outside the loaded crates."""
        entry = crate.paths.get(str(id_)) if id_ is not None else None
        if entry is None:
            return fallback
        return "::".join(entry["path"])

    def type_path(self, crate, id_, written):
        """Public path of a type, trait or other named item referenced in
        `crate`'s JSON."""
        res = self.resolve(crate, id_)
        if res is not None:
            owner, local = res
            found = owner.public_paths.get(local)
            if found:
                return "::".join(min(found, key=lambda p: (len(p), p)))
            entry = owner.paths.get(str(local))
            if entry is not None:
                return "::".join(entry["path"])
        return self.foreign_path(crate, id_, written)

    # ---- the walk ---------------------------------------------------------

    def walk(self, crate):
        """Every (path, Crate, id) reachable from `crate`'s root."""
        found = []
        root = int(crate.data["root"])
        found.append(((crate.name,), crate, root))
        self._walk_module(crate, root, (crate.name,), found, {(crate.name, root)})
        return found

    def _children(self, crate, module_id, stack):
        """(name, Crate, id, kind) of a module's public children, globs
        expanded, explicit names shadowing glob-imported ones."""
        module = crate.item(module_id)["inner"]["module"]
        explicit, globbed = [], []
        for child_id in module["items"]:
            child = crate.item(child_id)
            if child is None or child["visibility"] != "public":
                continue
            kind = kind_of(child)
            if kind == "use":
                use = child["inner"]["use"]
                target = self.resolve(crate, use["id"])
                if use["is_glob"]:
                    if target is None:
                        explicit.append((use["name"] + "::*", crate, child_id, "use"))
                        continue
                    owner, local = target
                    if (owner.name, local) in stack:
                        continue
                    titem = owner.item(local)
                    tkind = kind_of(titem)
                    if tkind == "module":
                        for entry in self._children(owner, local, stack | {(owner.name, local)}):
                            globbed.append(entry)
                    elif tkind == "enum":
                        for vid in titem["inner"]["enum"]["variants"]:
                            v = owner.item(vid)
                            globbed.append((v["name"], owner, vid, "variant"))
                    continue
                if target is None:
                    explicit.append((use["name"], crate, child_id, "use"))
                    continue
                owner, local = target
                explicit.append((use["name"], owner, local, kind_of(owner.item(local))))
            elif kind in ("impl", "primitive"):
                continue
            else:
                explicit.append((child["name"], crate, child_id, kind))
        taken = {(name, namespace(kind)) for name, _, _, kind in explicit}
        out = list(explicit)
        for entry in globbed:
            key = (entry[0], namespace(entry[3]))
            if key not in taken:
                taken.add(key)
                out.append(entry)
        return out

    def _walk_module(self, crate, module_id, prefix, found, stack):
        for name, owner, id_, kind in self._children(crate, module_id, stack):
            path = prefix + (name,)
            found.append((path, owner, id_))
            if kind != "use" and path[0] == owner.name:
                owner.public_paths.setdefault(id_, []).append(path)
            if kind == "module" and (owner.name, id_) not in stack:
                self._walk_module(owner, id_, path, found, stack | {(owner.name, id_)})

    # ---- rendering: types -------------------------------------------------

    def ty(self, c, t):
        if t is None:
            return "_"
        (k, v), = t.items()
        if k == "resolved_path":
            return self.path_with_args(c, v)
        if k == "dyn_trait":
            parts = [self.poly_trait(c, p) for p in v["traits"]]
            if v.get("lifetime"):
                parts.append(v["lifetime"])
            return "dyn " + " + ".join(parts)
        if k == "generic":
            return v
        if k == "primitive":
            return v
        if k == "function_pointer":
            return self.fn_pointer(c, v)
        if k == "tuple":
            inner = ", ".join(self.ty(c, x) for x in v)
            return f"({inner},)" if len(v) == 1 else f"({inner})"
        if k == "slice":
            return f"[{self.ty(c, v)}]"
        if k == "array":
            return f"[{self.ty(c, v['type'])}; {v['len']}]"
        if k == "pat":
            return f"{self.ty(c, v['type'])} is {v.get('__pat_unstable_do_not_use', '_')}"
        if k == "impl_trait":
            return "impl " + self.bounds(c, v)
        if k == "infer":
            return "_"
        if k == "raw_pointer":
            return ("*mut " if v["is_mutable"] else "*const ") + self.ty(c, v["type"])
        if k == "borrowed_ref":
            lt = (v["lifetime"] + " ") if v.get("lifetime") else ""
            mut = "mut " if v["is_mutable"] else ""
            return f"&{lt}{mut}{self.ty(c, v['type'])}"
        if k == "qualified_path":
            self_ty = self.ty(c, v["self_type"])
            args = self.generic_args(c, v.get("args"))
            if v.get("trait"):
                return f"<{self_ty} as {self.path_with_args(c, v['trait'])}>::{v['name']}{args}"
            return f"{self_ty}::{v['name']}{args}"
        raise KeyError(f"type kind {k}")

    def path_with_args(self, c, p):
        return self.type_path(c, p.get("id"), p["path"]) + self.generic_args(c, p.get("args"))

    def generic_args(self, c, args):
        if not args:
            return ""
        (k, v), = args.items() if isinstance(args, dict) else ((args, None),)
        if k == "angle_bracketed":
            parts = []
            for a in v["args"]:
                if a == "infer":
                    parts.append("_")
                    continue
                (ak, av), = a.items()
                if ak == "lifetime":
                    parts.append(av)
                elif ak == "type":
                    parts.append(self.ty(c, av))
                elif ak == "const":
                    parts.append(av.get("expr") or av.get("value") or "_")
            for con in v.get("constraints", []):
                name = con["name"] + self.generic_args(c, con.get("args"))
                (bk, bv), = con["binding"].items()
                if bk == "equality":
                    (ek, ev), = bv.items()
                    rhs = self.ty(c, ev) if ek == "type" else (ev.get("expr") or "_")
                    parts.append(f"{name} = {rhs}")
                else:
                    parts.append(f"{name}: {self.bounds(c, bv)}")
            return f"<{', '.join(parts)}>" if parts else ""
        if k == "parenthesized":
            inputs = ", ".join(self.ty(c, x) for x in v["inputs"])
            out = f" -> {self.ty(c, v['output'])}" if v.get("output") else ""
            return f"({inputs}){out}"
        if k == "return_type_notation":
            return "(..)"
        raise KeyError(f"generic args kind {k}")

    def poly_trait(self, c, p):
        hrtb = self.hrtb(c, p.get("generic_params", []))
        return hrtb + self.path_with_args(c, p["trait"])

    def hrtb(self, c, params):
        if not params:
            return ""
        return f"for<{', '.join(self.generic_param(c, p) for p in params)}> "

    def bounds(self, c, bounds):
        out = []
        for b in bounds:
            (k, v), = b.items()
            if k == "trait_bound":
                modifier = {"none": "", "maybe": "?", "maybe_const": "~const "}.get(v["modifier"], "")
                out.append(modifier + self.hrtb(c, v.get("generic_params", [])) + self.path_with_args(c, v["trait"]))
            elif k == "outlives":
                out.append(v)
            elif k == "use":
                names = []
                for a in v:
                    if isinstance(a, dict):
                        names.append(next(iter(a.values())))
                    else:
                        names.append(a)
                out.append(f"use<{', '.join(names)}>")
        return " + ".join(out)

    def generic_param(self, c, p):
        (k, v), = p["kind"].items()
        if k == "lifetime":
            return p["name"] + (": " + " + ".join(v["outlives"]) if v["outlives"] else "")
        if k == "type":
            s = p["name"]
            if v["bounds"]:
                s += ": " + self.bounds(c, v["bounds"])
            if v.get("default") is not None:
                s += " = " + self.ty(c, v["default"])
            return s
        if k == "const":
            s = f"const {p['name']}: {self.ty(c, v['type'])}"
            if v.get("default") is not None:
                s += f" = {v['default']}"
            return s
        raise KeyError(f"generic param kind {k}")

    def generics(self, c, g):
        params = [
            p for p in g["params"]
            if not (("type" in p["kind"]) and p["kind"]["type"].get("is_synthetic"))
        ]
        if not params:
            return ""
        return f"<{', '.join(self.generic_param(c, p) for p in params)}>"

    def where_clause(self, c, g):
        preds = []
        for w in g["where_predicates"]:
            (k, v), = w.items()
            if k == "bound_predicate":
                if not v["bounds"]:
                    continue
                preds.append(
                    self.hrtb(c, v.get("generic_params", []))
                    + f"{self.ty(c, v['type'])}: {self.bounds(c, v['bounds'])}"
                )
            elif k == "lifetime_predicate":
                preds.append(f"{v['lifetime']}: {' + '.join(v['outlives'])}")
            elif k == "eq_predicate":
                (rk, rv), = v["rhs"].items()
                rhs = self.ty(c, rv) if rk == "type" else (rv.get("expr") or "_")
                preds.append(f"{self.ty(c, v['lhs'])} = {rhs}")
        return f" where {', '.join(preds)}" if preds else ""

    def fn_pointer(self, c, v):
        header = self.header(v["header"])
        inputs = ", ".join(self.ty(c, t) for _, t in v["sig"]["inputs"])
        out = f" -> {self.ty(c, v['sig']['output'])}" if v["sig"].get("output") else ""
        return self.hrtb(c, v.get("generic_params", [])) + f"{header}fn({inputs}){out}"

    @staticmethod
    def header(h):
        s = ""
        if h.get("is_const"):
            s += "const "
        if h.get("is_async"):
            s += "async "
        if h.get("is_unsafe"):
            s += "unsafe "
        abi = h.get("abi")
        if abi and abi != "Rust":
            s += f'extern "{abi if isinstance(abi, str) else next(iter(abi))}" '
        return s

    def fn_sig(self, c, f, name):
        params = []
        for pname, pty in f["sig"]["inputs"]:
            if pname == "self":
                if pty == {"generic": "Self"}:
                    params.append("self")
                    continue
                if "borrowed_ref" in pty and pty["borrowed_ref"]["type"] == {"generic": "Self"}:
                    r = pty["borrowed_ref"]
                    lt = (r["lifetime"] + " ") if r.get("lifetime") else ""
                    params.append(f"&{lt}{'mut ' if r['is_mutable'] else ''}self")
                    continue
                params.append(f"self: {self.ty(c, pty)}")
            else:
                params.append(f"{pname}: {self.ty(c, pty)}")
        out = f" -> {self.ty(c, f['sig']['output'])}" if f["sig"].get("output") else ""
        return (
            f"{self.header(f['header'])}fn {name}{self.generics(c, f['generics'])}"
            f"({', '.join(params)}){out}{self.where_clause(c, f['generics'])}"
        )

    # ---- rendering: items -------------------------------------------------

    @staticmethod
    def attrs(item):
        marks = []
        for a in item.get("attrs", []):
            text = a if isinstance(a, str) else next(iter(a.values()), "")
            if isinstance(text, str) and ("non_exhaustive" in text) and "non_exhaustive" not in marks:
                marks.append("non_exhaustive")
        if item.get("deprecation") is not None:
            marks.append("deprecated")
        return "".join(f"#[{m}] " for m in marks)

    def render(self, path, c, id_, lines):
        """Append (sort key, line) pairs for the item `id_` of `c` at `path`."""
        item = c.item(id_)
        kind = kind_of(item)
        p = "::".join(path)
        inner = item["inner"][kind]
        pre = self.attrs(item)

        def add(key_path, order, line):
            lines.append((("::".join(key_path), order, line), line))

        if kind == "use":
            use = inner
            src = self.foreign_path(c, use["id"], use["source"])
            if use["is_glob"]:
                add(path[:-1], 0, f"pub use {'::'.join(path[:-1])}::* = {src}::*")
            else:
                add(path, 0, f"pub use {p} = {src}")
            return
        if kind == "module":
            add(path, 0, f"{pre}pub mod {p}")
            return
        if kind == "function":
            add(path, 0, f"{pre}pub " + self.fn_sig(c, inner, p))
            return
        if kind == "constant":
            add(path, 0, f"{pre}pub const {p}: {self.ty(c, inner['type'])}")
            return
        if kind == "static":
            mut = "mut " if inner.get("is_mutable") else ""
            add(path, 0, f"{pre}pub static {mut}{p}: {self.ty(c, inner['type'])}")
            return
        if kind == "type_alias":
            add(path, 0, f"{pre}pub type {p}{self.generics(c, inner['generics'])} = "
                f"{self.ty(c, inner['type'])}{self.where_clause(c, inner['generics'])}")
            return
        if kind in ("macro", "proc_macro"):
            add(path, 0, f"{pre}pub macro {p}!")
            return
        if kind == "variant":
            self.render_variant(path, c, item, add, pre)
            return
        if kind in ("struct", "union", "enum"):
            g = inner["generics"]
            head = f"{pre}pub {kind} {p}{self.generics(c, g)}"
            if kind == "struct":
                sk = inner["kind"]
                if sk == "unit":
                    head += ";"
                elif "tuple" in sk:
                    fields = ["_" if f is None else "pub " + self.ty(c, c.item(f)["inner"]["struct_field"])
                              for f in sk["tuple"]]
                    head += f"({', '.join(fields)})"
                else:
                    fields = sk["plain"]["fields"]
                    if sk["plain"]["has_stripped_fields"]:
                        head += " { .. }"
                    for f in fields:
                        fi = c.item(f)
                        add(path + (fi["name"],), 0,
                            f"{self.attrs(fi)}pub {p}.{fi['name']}: {self.ty(c, fi['inner']['struct_field'])}")
            elif kind == "union":
                for f in inner["fields"]:
                    fi = c.item(f)
                    add(path + (fi["name"],), 0,
                        f"pub {p}.{fi['name']}: {self.ty(c, fi['inner']['struct_field'])}")
            else:
                if inner.get("has_stripped_variants"):
                    head += " { .. }"
                for v in inner["variants"]:
                    vi = c.item(v)
                    self.render_variant(path + (vi["name"],), c, vi, add, self.attrs(vi))
            add(path, 0, head + self.where_clause(c, g))
            self_ty = p + self.generics_as_args(inner["generics"])
            for impl_id in inner["impls"]:
                self.render_impl(path, self_ty, c, id_, impl_id, add)
            return
        if kind == "trait":
            g = inner["generics"]
            unsafe = "unsafe " if inner.get("is_unsafe") else ""
            sup = f": {self.bounds(c, inner['bounds'])}" if inner["bounds"] else ""
            dyn = "" if inner.get("is_dyn_compatible", True) else " (not dyn-compatible)"
            add(path, 0, f"{pre}pub {unsafe}trait {p}{self.generics(c, g)}{sup}{self.where_clause(c, g)}{dyn}")
            for it_id in inner["items"]:
                it = c.item(it_id)
                if it is None:
                    continue
                self.render_assoc(path + (it["name"],), c, it, add, in_trait=True)
            for impl_id in inner.get("implementations", []):
                impl = c.item(impl_id)
                if impl is None:
                    continue
                for_ty = impl["inner"]["impl"]["for"]
                if "resolved_path" in for_ty and self.resolve(c, for_ty["resolved_path"].get("id")) is not None:
                    continue  # listed with the type
                add(path, 1, self.impl_head(c, impl["inner"]["impl"]))
            return
        if kind == "trait_alias":
            add(path, 0, f"{pre}pub trait {p} = {self.bounds(c, inner['params'])}")
            return
        add(path, 0, f"{pre}pub {kind} {p}")

    @staticmethod
    def generics_as_args(g):
        names = []
        for prm in g["params"]:
            if "type" in prm["kind"] and prm["kind"]["type"].get("is_synthetic"):
                continue
            names.append(prm["name"])
        return f"<{', '.join(names)}>" if names else ""

    def render_variant(self, path, c, vi, add, pre):
        p = "::".join(path)
        vk = vi["inner"]["variant"]["kind"]
        disc = vi["inner"]["variant"].get("discriminant")
        tail = f" = {disc['expr']}" if disc else ""
        if vk == "plain":
            add(path, 0, f"{pre}pub {p}{tail}")
        elif "tuple" in vk:
            fields = ["_" if f is None else self.ty(c, c.item(f)["inner"]["struct_field"]) for f in vk["tuple"]]
            add(path, 0, f"{pre}pub {p}({', '.join(fields)})")
        else:
            stripped = " .." if vk["struct"].get("has_stripped_fields") else ""
            add(path, 0, f"{pre}pub {p} {{{stripped} }}" if stripped else f"{pre}pub {p} {{ }}")
            for f in vk["struct"]["fields"]:
                fi = c.item(f)
                add(path + (fi["name"],), 0,
                    f"pub {p}.{fi['name']}: {self.ty(c, fi['inner']['struct_field'])}")

    def impl_head(self, c, impl, self_path=None, self_id=None):
        """`impl<..> Trait for Type where ..`; `self_path` names the type by
        the path being listed when the impl is for the item `self_id` (an
        impl of a type reachable by two paths shows under each, written
        with that path)."""
        g = impl["generics"]
        neg = "!" if impl.get("is_negative") else ""
        unsafe = "unsafe " if impl.get("is_unsafe") else ""
        trait = f"{neg}{self.path_with_args(c, impl['trait'])} for " if impl.get("trait") else ""
        for_ty = impl["for"]
        target = for_ty.get("resolved_path")
        if self_path is not None and target is not None and self.resolve(c, target.get("id")) == (c, self_id):
            for_text = self_path + self.generic_args(c, target.get("args"))
        else:
            for_text = self.ty(c, for_ty)
        return f"{unsafe}impl{self.generics(c, g)} {trait}{for_text}{self.where_clause(c, g)}"

    def render_impl(self, path, self_ty, c, self_id, impl_id, add):
        item = c.item(impl_id)
        if item is None:
            return
        impl = item["inner"]["impl"]
        if impl.get("trait") is not None:
            if impl.get("blanket_impl") is not None:
                return
            name = impl["trait"]["path"].rsplit("::", 1)[-1]
            if impl.get("is_synthetic") and name not in STABLE_AUTO_TRAITS:
                return  # Freeze, UnsafeUnpin: unstable auto traits, not API
            if name in UNSTABLE_MARKERS:
                return
            add(path, 1, self.impl_head(c, impl, "::".join(path), self_id))
            return
        for it_id in impl["items"]:
            it = c.item(it_id)
            if it is None or it["visibility"] != "public":
                continue
            self.render_assoc(path + (it["name"],), c, it, add, in_trait=False, self_ty=self_ty)

    def render_assoc(self, path, c, it, add, in_trait, self_ty=None):
        kind = kind_of(it)
        inner = it["inner"][kind]
        owner = "::".join(path[:-1]) if self_ty is None else self_ty
        name = f"{owner}::{it['name']}"
        pre = self.attrs(it)
        vis = "" if in_trait else "pub "
        if kind == "function":
            provided = " { .. }" if in_trait and inner.get("has_body") else ""
            add(path, 0, f"{pre}{vis}{self.fn_sig(c, inner, name)}{provided}")
        elif kind == "assoc_const":
            default = " = .." if in_trait and inner.get("value") is not None else ""
            add(path, 0, f"{pre}{vis}const {name}: {self.ty(c, inner['type'])}{default}")
        elif kind == "assoc_type":
            b = f": {self.bounds(c, inner['bounds'])}" if inner.get("bounds") else ""
            t = f" = {self.ty(c, inner['type'])}" if inner.get("type") is not None else ""
            add(path, 0, f"{pre}{vis}type {name}{self.generics(c, inner['generics'])}{b}{t}")
        else:
            add(path, 0, f"{pre}{vis}{kind} {name}")


def summary(api, crate, found, lines):
    """Counts for one crate:
    root: distinct names directly under the crate root (items and re-exports,
      modules included);
    paths: public paths of items (not fields, variants, impls or members);
    declarations: items this crate itself defines that are reachable
      (fn, method, struct, enum, trait, type, const, static, mod, macro;
      re-exports not counted, methods and trait items counted), and of
      those the ones under a `testkit` module;
    fields, variants: public fields and enum variants of those types.
    """
    root = {path[1] for path, _, _ in found if len(path) == 2}
    decls, testkit, fields, variants = set(), set(), set(), set()
    for path, owner, id_ in found:
        if owner is not crate or len(path) == 1:
            continue
        item = owner.item(id_)
        kind = kind_of(item)
        if kind not in DECLARATION_KINDS:
            continue
        members = set()
        inner = item["inner"][kind]
        if kind == "struct" and "plain" in inner["kind"]:
            fields.update(inner["kind"]["plain"]["fields"])
        if kind == "enum":
            variants.update(inner["variants"])
        if kind in ("struct", "enum", "union"):
            for impl_id in inner["impls"]:
                impl = owner.item(impl_id)
                if impl is None or impl["inner"]["impl"].get("trait") is not None:
                    continue
                members.update(
                    i for i in impl["inner"]["impl"]["items"]
                    if owner.item(i) is not None and owner.item(i)["visibility"] == "public"
                )
        if kind == "trait":
            members.update(inner["items"])
        new = {id_} | members
        decls |= new
        if "testkit" in path:
            testkit |= new
    return {
        "root": len(root),
        "paths": len(found) - 1,
        "declarations": len(decls),
        "testkit": len(testkit),
        "fields": len(fields),
        "variants": len(variants),
        "lines": len(lines),
    }


def main(argv):
    if len(argv) < 4:
        sys.exit(__doc__)
    doc_dir, out_dir, packages = argv[1], argv[2], argv[3:]
    crates = {}
    order = []
    for package in packages:
        file = os.path.join(doc_dir, package.replace("-", "_") + ".json")
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
        version = data.get("format_version")
        if version not in KNOWN_FORMAT_VERSIONS:
            print(
                f"note: {file} has rustdoc JSON format {version}; this script was written "
                f"for {sorted(KNOWN_FORMAT_VERSIONS)}",
                file=sys.stderr,
            )
        crate = Crate(package, data)
        crates[crate.name] = crate
        order.append(crate)
    api = Api(crates)
    found = {crate.name: api.walk(crate) for crate in order}
    os.makedirs(out_dir, exist_ok=True)
    print(f"{'crate':<16}{'root':>6}{'paths':>7}{'decls':>7}{'testkit':>9}{'fields':>8}{'variants':>10}{'lines':>7}")
    for crate in order:
        lines = []
        for path, owner, id_ in found[crate.name]:
            api.render(path, owner, id_, lines)
        text = sorted(set(lines))
        with open(os.path.join(out_dir, crate.package + ".txt"), "w", encoding="utf-8") as f:
            for _, line in text:
                f.write(line + "\n")
        s = summary(api, crate, found[crate.name], text)
        print(
            f"{crate.package:<16}{s['root']:>6}{s['paths']:>7}{s['declarations']:>7}"
            f"{s['testkit']:>9}{s['fields']:>8}{s['variants']:>10}{s['lines']:>7}"
        )
    print(
        "root: names directly under the crate root (idem's is capped at 40 by issue 18); "
        "paths: public item paths; decls: items the crate defines, methods and trait items "
        "included; testkit: of those, under a testkit module; lines: lines of the snapshot"
    )
    for w in sorted(set(api.warnings)):
        print("warning: " + w, file=sys.stderr)


if __name__ == "__main__":
    try:
        main(sys.argv)
    except (KeyError, TypeError, ValueError) as e:
        sys.exit(
            f"public_api.py: cannot read rustdoc's JSON ({type(e).__name__}: {e}); "
            f"the script was written for format {sorted(KNOWN_FORMAT_VERSIONS)}"
        )
