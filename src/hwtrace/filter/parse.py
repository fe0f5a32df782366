r"""Parse LTTng filter expressions into the syntax tree of :mod:`.ast`.

The grammar is LTTng's (``filter-parser.ypp`` of lttng-tools), written for
lark's LALR parser.  Binary arithmetic (``* / % + -``) is in the grammar at
C's precedence, as in LTTng, only so that it can be refused with a message
that names the operator: LTTng filters have no arithmetic.

Where LTTng's documentation is silent, this parser follows its lexer:
integer literals take C's suffixes (``10u``, ``0xffUL``), floats ``f``/``l``;
names may hold ``:`` (``$app.PROVIDER:NAME``, ``$ctx.perf:cpu:cycles``);
a raw line break inside a string literal is dropped.  It departs from it
where the design note says so: the escapes ``\\ \" \* \n \t \r`` work (LTTng
refuses escapes), an index must be a constant non-negative integer, and
``->``, single-quoted strings and comments are refused with a message.

Columns are 1-based character offsets into the text (a newline counts as
one column, as :class:`~.errors.FilterError` prints the text on one line).
Every node gets the column of its first character, except binary and
logical nodes, which get their operator's column (type errors point there).
"""

from __future__ import annotations

import re

from lark import Lark, Token, Tree
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from . import ast
from .errors import FilterError

# Precedence, lowest first: || && (== !=) (< <= > >=) | ^ & (<< >>)
# [(+ -) (* / %): refused] unary.  Bitwise binds tighter than comparison.
_GRAMMAR = r"""
?start: or_expr

?or_expr: and_expr
    | or_expr OROR and_expr                 -> logical
?and_expr: eq_expr
    | and_expr ANDAND eq_expr               -> logical
?eq_expr: rel_expr
    | eq_expr (EQ | NE) rel_expr            -> binary
?rel_expr: bor_expr
    | rel_expr (LT | LE | GT | GE) bor_expr -> binary
?bor_expr: bxor_expr
    | bor_expr BOR bxor_expr                -> binary
?bxor_expr: band_expr
    | bxor_expr BXOR band_expr              -> binary
?band_expr: shift_expr
    | band_expr BAND shift_expr             -> binary
?shift_expr: add_expr
    | shift_expr (SHL | SHR) add_expr       -> binary
?add_expr: mul_expr
    | add_expr (PLUS | MINUS) mul_expr      -> arithmetic
?mul_expr: unary_expr
    | mul_expr (STAR | SLASH | PERCENT) unary_expr -> arithmetic
?unary_expr: atom
    | (BANG | TILDE | MINUS | PLUS) unary_expr -> unary
?atom: NUMBER                               -> number
    | STRING                                -> string
    | LPAR or_expr RPAR                     -> paren
    | field

field: (NAME | GLOBAL DOT NAME) accessor*
accessor: DOT NAME
    | LSQB or_expr RSQB

OROR: "||"
ANDAND: "&&"
EQ: "=="
NE: "!="
LE: "<="
GE: ">="
SHL: "<<"
SHR: ">>"
LT: "<"
GT: ">"
BOR: "|"
BXOR: "^"
BAND: "&"
PLUS: "+"
MINUS: "-"
STAR: "*"
SLASH: "/"
PERCENT: "%"
BANG: "!"
TILDE: "~"
LPAR: "("
RPAR: ")"
LSQB: "["
RSQB: "]"
DOT: "."
ARROW: "->"

// C's preprocessing number: every digit run, hex, float or malformed
// number is one token, classified (or refused) when the tree is built.
NUMBER.2: /(?:\d|\.\d)(?:[eE][+-]|[\w.])*/
STRING: /"(?:[^"\\]|\\.)*"/s
// Identifiers may hold ':' as LTTng's do ($app.PROVIDER:NAME).
NAME: /[A-Za-z_]\w*(?::[A-Za-z_0-9]\w*)*/
GLOBAL: /\$[A-Za-z_]\w*/

%ignore /[ \t\r\n\f\v]+/
"""

# ARROW is never accepted by the grammar: declaring it makes "->" one token,
# refused below with its own message.  It must appear in a rule to be kept.
_GRAMMAR = _GRAMMAR.replace("| LSQB or_expr RSQB", "| LSQB or_expr RSQB\n    | ARROW NAME")

_LARK = Lark(_GRAMMAR, parser="lalr", lexer="basic", maybe_placeholders=False)

#: Deeper trees are refused: every pass over the tree (checker, tiers,
#: oracle) may recurse once per level.
MAX_DEPTH = 250

_S64_MIN = -(1 << 63)
_U64_MAX = (1 << 64) - 1

_DECIMAL = re.compile(r"[1-9]\d*|0")
_OCTAL = re.compile(r"0[0-7]+")
_HEX = re.compile(r"0[xX][0-9a-fA-F]+")
_INT_SUFFIX = re.compile(r"(?:[uU](?:ll|LL|l|L)?|(?:ll|LL|l|L)[uU]?)$")
_FLOAT = re.compile(r"(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+")

_ESCAPES = {"\\": "\\", '"': '"', "n": "\n", "t": "\t", "r": "\r"}

_BINARY_TOKENS = {
    "OROR",
    "ANDAND",
    "EQ",
    "NE",
    "LT",
    "LE",
    "GT",
    "GE",
    "BOR",
    "BXOR",
    "BAND",
    "SHL",
    "SHR",
    "STAR",
    "SLASH",
    "PERCENT",
}
_UNARY_TOKENS = {"BANG", "TILDE", "MINUS", "PLUS"}
_OPERAND_START = {"NUMBER", "STRING", "NAME", "GLOBAL", "LPAR"} | _UNARY_TOKENS
_OPERAND_END = {"NUMBER", "STRING", "NAME", "RPAR", "RSQB"}


def wrap_s64(value: int) -> int:
    """``value`` modulo 2^64, as a signed 64-bit integer."""
    value &= _U64_MAX
    return value - (1 << 64) if value >> 63 else value


def parse(text: str) -> ast.Node:
    """The syntax tree of the filter expression ``text``.

    Raises :class:`FilterError` (with ``expression`` and ``column``) for
    anything that is not a well-formed LTTng filter expression.
    """
    try:
        tokens = _tokens(text)
        if not tokens:
            raise FilterError("empty filter expression", column=1)
        tree = _parse_tokens(text, tokens)
        return _Builder(text).node(tree, 1)
    except FilterError as e:
        if e.expression is None:
            e.expression = text
        raise
    except RecursionError:
        raise FilterError("expression nested too deeply", expression=text, column=1) from None
    except LarkError as e:  # anything the cases below did not foresee
        raise FilterError(f"syntax error ({type(e).__name__})", expression=text, column=1) from None


# -- tokens and syntax errors ------------------------------------------------------


def _tokens(text: str) -> list[Token]:
    tokens: list[Token] = []
    try:
        for tok in _LARK.lex(text):
            tokens.append(tok)
    except UnexpectedCharacters as e:
        pos = e.pos_in_stream
        ch = text[pos]
        column = pos + 1
        if ch == '"':
            raise FilterError("unterminated string", column=column) from None
        if ch == "=":
            raise FilterError("unexpected '='; did you mean '=='?", column=column) from None
        if ch == "$":
            raise FilterError(
                "'$' must start $ctx.NAME or $app.PROVIDER:NAME", column=column
            ) from None
        if ch == "'":
            raise FilterError("strings are written in double quotes", column=column) from None
        raise FilterError(f"unexpected character {_show(ch)}", column=column) from None
    return tokens


def _show(s: str) -> str:
    """A token's text for a message, quoted as the user typed it."""
    if len(s) > 24:
        s = s[:21] + "..."
    if s.isprintable():
        return f"'{s}'"
    return repr(s)


def _parse_tokens(text: str, tokens: list[Token]) -> Tree:
    parser = _LARK.parse_interactive(text)
    for i, tok in enumerate(tokens):
        try:
            parser.feed_token(tok)
        except UnexpectedToken:
            raise _syntax_error(tokens, i) from None
    try:
        return parser.feed_eof(tokens[-1])
    except UnexpectedInput:
        raise _syntax_error(tokens, len(tokens)) from None


def _syntax_error(tokens: list[Token], i: int) -> FilterError:
    """The message for an unexpected ``tokens[i]`` (``i == len(tokens)``: the
    end of the text), from what came before it."""
    prev = tokens[i - 1] if i else None
    at_end = i == len(tokens)
    tok = None if at_end else tokens[i]
    column = prev.end_pos + 1 if at_end else tok.start_pos + 1  # type: ignore[union-attr]
    what = "end of expression" if tok is None else _show(str(tok))

    if tok is not None and tok.type == "ARROW":
        return FilterError("'->' is not supported; use '.' for members", column=column)
    if tok is not None and tok.type in ("PLUS", "MINUS") and prev.type in _OPERAND_END:  # type: ignore[union-attr]
        return FilterError(f"arithmetic operator '{tok}' is not supported", column=column)
    if prev is not None and prev.type == "GLOBAL" and (tok is None or tok.type != "DOT"):
        return FilterError(f"expected '.' after '{prev}'", column=column)
    if prev is not None and prev.type == "DOT" and (tok is None or tok.type != "NAME"):
        return FilterError(f"expected a field name after '.', not {what}", column=column)
    if prev is not None and (prev.type in _BINARY_TOKENS | _UNARY_TOKENS | {"LPAR", "LSQB"}):
        if tok is None or tok.type not in _OPERAND_START:
            return FilterError(f"expected an operand after '{prev}', not {what}", column=column)
    if tok is None:
        opened = _unclosed(tokens)
        if opened is not None:
            return FilterError(f"unclosed '{opened}'", column=opened.start_pos + 1)
        return FilterError("unexpected end of expression", column=column)
    if prev is not None and prev.type in _OPERAND_END and tok.type in _OPERAND_START:
        return FilterError(f"unexpected {what}; expected an operator", column=column)
    return FilterError(f"unexpected {what}", column=column)


def _unclosed(tokens: list[Token]) -> Token | None:
    stack: list[Token] = []
    for tok in tokens:
        if tok.type in ("LPAR", "LSQB"):
            stack.append(tok)
        elif tok.type in ("RPAR", "RSQB") and stack:
            stack.pop()
    return stack[-1] if stack else None


# -- building the tree ---------------------------------------------------------------


class _Builder:
    def __init__(self, text: str) -> None:
        self.text = text

    def node(self, t: Tree | Token, depth: int) -> ast.Node:
        if depth > MAX_DEPTH:
            raise FilterError(
                f"expression nested too deeply (more than {MAX_DEPTH} levels)",
                column=_first_column(t),
            )
        if isinstance(t, Token):  # cannot happen: atoms are always wrapped
            raise FilterError(f"unexpected {_show(str(t))}", column=t.start_pos + 1)
        kind = t.data
        c = t.children
        if kind == "number":
            return self.number(c[0])
        if kind == "string":
            return self.string(c[0])
        if kind == "paren":
            return self.node(c[1], depth + 1)
        if kind == "field":
            return self.field(c, depth)
        if kind == "unary":
            op = c[0]
            return ast.Unary(str(op), self.node(c[1], depth + 1), column=op.start_pos + 1)
        if kind == "arithmetic":
            # Children first, so the leftmost innermost operator is named.
            self.node(c[0], depth + 1)
            op = c[1]
            raise FilterError(
                f"arithmetic operator '{op}' is not supported", column=op.start_pos + 1
            )
        if kind == "logical":
            return self.chain(t, depth)
        if kind == "binary":
            left = self.node(c[0], depth + 1)
            op = c[1]
            right = self.node(c[2], depth + 1)
            return ast.Binary(str(op), left, right, column=op.start_pos + 1)
        raise FilterError(f"unexpected construct {kind!r}", column=_first_column(t))

    def chain(self, t: Tree, depth: int) -> ast.Node:
        """``a || b || c ...`` (one operator, as the grammar's left-recursive
        rule nests it) as a balanced tree: ``&&`` and ``||`` are associative
        and the operands keep their order, so evaluation (short circuits
        and LTTng's abort on missing data) is unchanged, while a flat chain
        of N terms is log2(N) levels deep, not N, for every later pass."""
        op = t.children[1]
        operands: list[Tree] = []
        ops: list[Token] = []
        while isinstance(t, Tree) and t.data == "logical" and t.children[1].type == op.type:
            operands.append(t.children[2])
            ops.append(t.children[1])
            t = t.children[0]
        operands.append(t)
        operands.reverse()
        ops.reverse()
        levels = max(len(operands) - 1, 1).bit_length()
        built = [self.node(x, depth + levels) for x in operands]

        def join(lo: int, hi: int) -> ast.Node:  # operands[lo:hi], hi - lo >= 1
            if hi - lo == 1:
                return built[lo]
            mid = (lo + hi + 1) // 2  # leaning left: a || b || c is (a || b) || c
            tok = ops[mid - 1]  # the operator between operands mid-1 and mid
            return ast.Logical(str(tok), join(lo, mid), join(mid, hi), column=tok.start_pos + 1)

        return join(0, len(built))

    # Literals.

    def number(self, tok: Token) -> ast.Node:
        text = str(tok)
        column = tok.start_pos + 1
        if _FLOAT.fullmatch(text):
            return ast.FloatLit(float(text), column=column)
        if text[-1] in "fFlL" and _FLOAT.fullmatch(text[:-1]):  # C's float suffixes
            return ast.FloatLit(float(text[:-1]), column=column)
        s = _INT_SUFFIX.sub("", text)  # C's integer suffixes: 10u, 0xffUL
        if _HEX.fullmatch(s):
            value = int(s, 16)
        elif _OCTAL.fullmatch(s):
            value = int(s, 8)
        elif _DECIMAL.fullmatch(s):
            value = int(s, 10)
        elif re.fullmatch(r"0\d+", s):
            raise FilterError(f"invalid octal literal '{s}'", column=column)
        else:
            raise FilterError(f"invalid number {_show(text)}", column=column)
        if value > _U64_MAX:
            raise FilterError(
                f"integer literal {text} is out of range (above 2^64-1)", column=column
            )
        return ast.IntLit(wrap_s64(value), column=column)

    def string(self, tok: Token) -> ast.StrLit:
        raw = str(tok)[1:-1]
        start = tok.start_pos + 2  # column of the first character inside the quotes
        parts: list[str] = []
        cur: list[str] = []
        i = 0
        while i < len(raw):
            ch = raw[i]
            if ch == "\\":
                nxt = raw[i + 1]  # the token regex guarantees one
                if nxt == "*":
                    cur.append("*")
                elif nxt in _ESCAPES:
                    cur.append(_ESCAPES[nxt])
                else:
                    raise FilterError(
                        f"unknown escape {_show(chr(92) + nxt)} in string "
                        '(known: \\\\ \\" \\* \\n \\t \\r)',
                        column=start + i,
                    )
                i += 2
                continue
            if ch == "\n":  # as LTTng's lexer: a line break in a literal is dropped
                i += 1
                continue
            if ch == "\0":
                raise FilterError("NUL character in string", column=start + i)
            if ch == "*":
                parts.append("".join(cur))
                cur = []
            else:
                cur.append(ch)
            i += 1
        parts.append("".join(cur))
        try:
            encoded = tuple(p.encode("utf-8") for p in parts)
        except UnicodeEncodeError as e:
            raise FilterError("string is not valid Unicode", column=tok.start_pos + 1) from e
        return ast.StrLit(encoded, column=tok.start_pos + 1)

    # Fields.

    def field(self, c: list, depth: int) -> ast.FieldRef:
        head = c[0]
        column = head.start_pos + 1
        names: list[str | int] = []
        if head.type == "GLOBAL":
            scope = str(head)[1:]
            name = c[2]
            if scope == "ctx":
                root = "ctx"
            elif scope == "app":
                root = "app"
                if str(name).count(":") != 1:
                    raise FilterError(
                        f"application context '$app.{name}' must be $app.PROVIDER:NAME",
                        column=name.start_pos + 1,
                    )
            else:
                raise FilterError(
                    f"unknown '${scope}': use $ctx.NAME or $app.PROVIDER:NAME", column=column
                )
            names.append(str(name))
            rest = c[3:]
        else:
            root = "event"
            names.append(str(head))
            rest = c[1:]
        for acc in rest:
            first = acc.children[0]
            if first.type == "DOT":
                names.append(str(acc.children[1]))
            elif first.type == "ARROW":
                raise FilterError(
                    "'->' is not supported; use '.' for members", column=first.start_pos + 1
                )
            else:
                names.append(self.index(acc.children[1], depth + 1))
        return ast.FieldRef(root, tuple(names), column=column)  # type: ignore[arg-type]

    def index(self, t: Tree, depth: int) -> int:
        node = self.node(t, depth)
        if not isinstance(node, ast.IntLit):
            raise FilterError(
                "an index must be a constant non-negative integer", column=node.column
            )
        if node.value < 0:
            raise FilterError(f"index {node.value & _U64_MAX} is out of range", column=node.column)
        return node.value


def _first_column(t: Tree | Token) -> int:
    while isinstance(t, Tree):
        if not t.children:
            return 1
        t = t.children[0]
    return t.start_pos + 1
