"""Go's text/template parser, as far as its errors go: what Ollama answers a request whose
own `template` does not parse.

GenerateHandler parses the request's template only once its model is loaded
(server/routes.go, `template.Parse(req.Template)`; template/template.go Parse: text/template
with `missingkey=zero` and Ollama's four functions, then Template.Vars, whose Identifiers
refuses a `{{template "name"}}` without a pipeline). The error is answered as a 500 with
text/template's own words, e.g. `template: :1: unclosed action`.

This is a port of Go 1.26's text/template/parse lex.go and parse.go: the lexer's state
machine, the parser's three-token lookahead (an error names the line of the last token
lexed, as `Tree.errorf` does), the checks it makes while parsing (functions, variables,
{{break}} outside {{range}}, pipelines, definitions). It builds no tree it does not need;
a template that parses is not executed (an execution error is not modelled).
"""

from __future__ import annotations

import attrs

from gpugate.sim.ollama.gofold import go_quote as _quote
from gpugate.sim.ollama.gostrconv import TemplateError, number_error, unquote
from gpugate.sim.ollama.gotemplate_lex import LEFT, RIGHT, Item, Lexer, Token

__all__ = ["TemplateError", "parse"]

FUNCTIONS = frozenset(
    {"and", "call", "html", "index", "slice", "js", "len", "not", "or", "print", "printf"}
    | {"println", "urlquery", "eq", "ge", "gt", "le", "lt", "ne"}  # text/template builtins
    | {"json", "currentDate", "yesterdayDate", "toTypeScriptType"}  # template.go funcs
)


@attrs.define
class Node:
    """A parse node, as far as the parser's checks and Ollama's Identifiers look at it."""

    kind: str
    text: str = ""
    """What String() gives, where an error quotes it."""
    pipe: Node | None = None
    nodes: list[Node] = attrs.field(factory=list)
    """A list's nodes; a branch's list then its else list; a pipe's commands' arguments."""
    args: list[Node] = attrs.field(factory=list)

    def __str__(self) -> str:
        return self.text


_CONSTANTS = ("bool", "dot", "nil", "number", "string")
_OPERANDS = {
    Item.BOOL, Item.CHAR_CONSTANT, Item.COMPLEX, Item.DOT, Item.FIELD, Item.IDENTIFIER,
    Item.NUMBER, Item.NIL, Item.RAW_STRING, Item.STRING, Item.VARIABLE, Item.LEFT_PAREN,
}  # fmt: skip
MAX_STACK_DEPTH = 10000


class _Tree:
    """parse.go Tree: one template (the text's, or a {{define}}'s) on the shared lexer."""

    def __init__(self, name: str, lexer: Lexer, trees: dict[str, _Tree]) -> None:
        self.name = name
        self.lex = lexer
        self.trees = trees
        self.root: Node | None = None
        self.token = [Token(Item.EOF, 0, "", 0)] * 3
        self.peek_count = 0
        self.vars = ["$"]
        self.action_line = 0
        self.range_depth = 0
        self.stack_depth = 0

    # -- tokens ----------------------------------------------------------------------------

    def next(self) -> Token:
        if self.peek_count > 0:
            self.peek_count -= 1
        else:
            self.token[0] = self.lex.next_item()
        return self.token[self.peek_count]

    def backup(self) -> None:
        self.peek_count += 1

    def backup2(self, t1: Token) -> None:
        self.token[1] = t1
        self.peek_count = 2

    def backup3(self, t2: Token, t1: Token) -> None:
        self.token[1] = t1
        self.token[2] = t2
        self.peek_count = 3

    def peek(self) -> Token:
        if self.peek_count > 0:
            return self.token[self.peek_count - 1]
        self.peek_count = 1
        self.token[0] = self.lex.next_item()
        return self.token[0]

    def next_non_space(self) -> Token:
        while True:
            token = self.next()
            if token.typ is not Item.SPACE:
                return token

    def peek_non_space(self) -> Token:
        token = self.next_non_space()
        self.backup()
        return token

    # -- errors ----------------------------------------------------------------------------

    def errorf(self, message: str) -> TemplateError:
        return TemplateError(f"template: :{self.token[0].line}: {message}")

    def expect(self, expected: Item, context: str) -> Token:
        token = self.next_non_space()
        if token.typ is not expected:
            raise self.unexpected(token, context)
        return token

    def unexpected(self, token: Token, context: str) -> TemplateError:
        if token.typ is Item.ERROR:
            extra = ""
            if self.action_line not in (0, token.line):
                extra = f" in action started at :{self.action_line}"
                if token.val.endswith(" action"):
                    extra = extra[len(" in action") :]
            return self.errorf(f"{token}{extra}")
        return self.errorf(f"unexpected {token} in {context}")

    # -- the grammar -----------------------------------------------------------------------

    def parse(self) -> None:
        self.root = Node("list")
        while self.peek().typ is not Item.EOF:
            if self.peek().typ is Item.LEFT_DELIM:
                delim = self.next()
                if self.next_non_space().typ is Item.DEFINE:
                    _Tree("definition", self.lex, self.trees).parse_definition()
                    continue
                self.backup2(delim)
            node = self.text_or_action()
            if node.kind in ("end", "else"):
                raise self.errorf(f"unexpected {node}")
            self.root.nodes.append(node)

    def parse_definition(self) -> None:
        context = "define clause"
        token = self.next_non_space()
        if token.typ not in (Item.STRING, Item.RAW_STRING):
            raise self.unexpected(token, context)
        try:
            self.name = unquote(token.val)
        except TemplateError as exc:
            raise self.errorf(str(exc)) from None
        self.expect(Item.RIGHT_DELIM, context)
        self.root, end = self.item_list()
        if end.kind != "end":
            raise self.errorf(f"unexpected {end} in {context}")
        self.add()

    def add(self) -> None:
        tree = self.trees.get(self.name)
        if tree is None or _empty(tree.root):
            self.trees[self.name] = self
            return
        if not _empty(self.root):
            raise self.errorf(f"template: multiple definition of template {_quote(self.name)}")

    def item_list(self) -> tuple[Node, Node]:
        found = Node("list")
        while self.peek_non_space().typ is not Item.EOF:
            node = self.text_or_action()
            if node.kind in ("end", "else"):
                return found, node
            found.nodes.append(node)
        raise self.errorf("unexpected EOF")

    def text_or_action(self) -> Node:
        token = self.next_non_space()
        if token.typ is Item.TEXT:
            return Node("text", token.val)
        if token.typ is Item.LEFT_DELIM:
            self.action_line = token.line
            try:
                return self.action()
            finally:
                self.action_line = 0
        if token.typ is Item.COMMENT:
            return Node("comment")
        raise self.unexpected(token, "input")

    def action(self) -> Node:
        token = self.next_non_space()
        if token.typ is Item.BLOCK:
            return self.block_control()
        if token.typ in (Item.BREAK, Item.CONTINUE):
            word = token.val
            after = self.next_non_space()
            if after.typ is not Item.RIGHT_DELIM:
                raise self.unexpected(after, f"{{{{{word}}}}}")
            if self.range_depth == 0:
                raise self.errorf(f"{{{{{word}}}}} outside {{{{range}}}}")
            return Node(word)
        if token.typ is Item.ELSE:
            ahead = self.peek_non_space()
            if ahead.typ not in (Item.IF, Item.WITH):
                self.expect(Item.RIGHT_DELIM, "else")
            return Node("else", LEFT + "else" + RIGHT)
        if token.typ is Item.END:
            self.expect(Item.RIGHT_DELIM, "end")
            return Node("end", LEFT + "end" + RIGHT)
        if token.typ in (Item.IF, Item.RANGE, Item.WITH):
            return self.control(token.val)
        if token.typ is Item.TEMPLATE:
            return self.template_control()
        self.backup()
        self.peek()
        return Node("action", pipe=self.pipeline("command", Item.RIGHT_DELIM))

    def control(self, context: str) -> Node:
        """parseControl: the pipeline, the list, an else list (or else if/with)."""
        depth = len(self.vars)
        try:
            pipe = self.pipeline(context, Item.RIGHT_DELIM)
            if context == "range":
                self.range_depth += 1
            body, after = self.item_list()
            if context == "range":
                self.range_depth -= 1
            branch = Node(context, pipe=pipe, nodes=[body])
            if after.kind == "else":
                chained = {"if": Item.IF, "with": Item.WITH}.get(context)
                if chained is not None and self.peek().typ is chained:
                    self.next()
                    branch.nodes.append(Node("list", nodes=[self.control(context)]))
                else:
                    otherwise, after = self.item_list()
                    if after.kind != "end":
                        raise self.errorf(f"expected end; found {after}")
                    branch.nodes.append(otherwise)
            return branch
        finally:
            del self.vars[depth:]

    def block_control(self) -> Node:
        context = "block clause"
        token = self.next_non_space()
        name = self.template_name(token, context)
        pipe = self.pipeline(context, Item.RIGHT_DELIM)
        block = _Tree(name, self.lex, self.trees)
        block.root, end = block.item_list()
        if end.kind != "end":
            raise self.errorf(f"unexpected {end} in {context}")
        block.add()
        return Node("template", pipe=pipe)

    def template_control(self) -> Node:
        context = "template clause"
        token = self.next_non_space()
        self.template_name(token, context)
        pipe = None
        if self.next_non_space().typ is not Item.RIGHT_DELIM:
            self.backup()
            pipe = self.pipeline(context, Item.RIGHT_DELIM)
        return Node("template", pipe=pipe)

    def template_name(self, token: Token, context: str) -> str:
        if token.typ not in (Item.STRING, Item.RAW_STRING):
            raise self.unexpected(token, context)
        try:
            return unquote(token.val)
        except TemplateError as exc:
            raise self.errorf(str(exc)) from None

    def pipeline(self, context: str, end: Item) -> Node:
        self.peek_non_space()
        pipe = Node("pipe")
        declared = 0
        while True:  # the `decls:` label
            variable = self.peek_non_space()
            if variable.typ is not Item.VARIABLE:
                break
            self.next()
            after = self.peek()
            ahead = self.peek_non_space()
            if ahead.typ in (Item.ASSIGN, Item.DECLARE):
                self.next_non_space()
                self.vars.append(variable.val)
            elif ahead.typ is Item.CHAR and ahead.val == ",":
                self.next_non_space()
                self.vars.append(variable.val)
                declared += 1
                if context == "range" and declared < 2:
                    following = self.peek_non_space().typ
                    if following in (Item.VARIABLE, Item.RIGHT_DELIM, Item.RIGHT_PAREN):
                        continue
                    raise self.errorf("range can only initialize variables")
                raise self.errorf(f"too many declarations in {context}")
            elif after.typ is Item.SPACE:
                self.backup3(variable, after)
            else:
                self.backup2(variable)
            break
        while True:
            token = self.next_non_space()
            if token.typ is end:
                self.check_pipeline(pipe, context)
                return pipe
            if token.typ not in _OPERANDS:
                raise self.unexpected(token, context)
            self.backup()
            pipe.nodes.append(self.command())

    def check_pipeline(self, pipe: Node, context: str) -> None:
        if not pipe.nodes:
            raise self.errorf(f"missing value for {context}")
        for stage, command in enumerate(pipe.nodes[1:], 2):
            if command.args[0].kind in _CONSTANTS:
                raise self.errorf(f"non executable command in pipeline stage {stage}")

    def command(self) -> Node:
        self.peek_non_space()
        command = Node("command")
        while True:
            self.peek_non_space()
            operand = self.operand()
            if operand is not None:
                command.args.append(operand)
            token = self.next()
            if token.typ is Item.SPACE:
                continue
            if token.typ in (Item.RIGHT_DELIM, Item.RIGHT_PAREN):
                self.backup()
            elif token.typ is not Item.PIPE:
                raise self.unexpected(token, "operand")
            break
        if not command.args:
            raise self.errorf("empty command")
        return command

    def operand(self) -> Node | None:
        node = self.term()
        if node is None:
            return None
        if self.peek().typ is Item.FIELD:
            chain = node.text
            while self.peek().typ is Item.FIELD:
                chain += self.next().val
            if node.kind in ("field", "variable"):
                return Node(node.kind, chain)
            if node.kind in _CONSTANTS:
                raise self.errorf(f"unexpected . after term {_quote(node.text)}")
            return Node("chain", chain, args=[node])
        return node

    def term(self) -> Node | None:
        token = self.next_non_space()
        typ = token.typ
        if typ is Item.IDENTIFIER:
            if token.val not in FUNCTIONS:
                raise self.errorf(f"function {_quote(token.val)} not defined")
            return Node("identifier", token.val)
        if typ is Item.DOT:
            return Node("dot", ".")
        if typ is Item.NIL:
            return Node("nil", "nil")
        if typ is Item.VARIABLE:
            head = token.val.split(".")[0]
            if head not in self.vars:
                raise self.errorf(f"undefined variable {_quote(head)}")
            return Node("variable", token.val)
        if typ is Item.FIELD:
            return Node("field", token.val)
        if typ is Item.BOOL:
            return Node("bool", token.val)
        if typ in (Item.CHAR_CONSTANT, Item.COMPLEX, Item.NUMBER):
            error = number_error(token.val, typ)
            if error is not None:
                raise self.errorf(error)
            return Node("number", token.val)
        if typ is Item.LEFT_PAREN:
            if self.stack_depth >= MAX_STACK_DEPTH:
                raise self.errorf("max expression depth exceeded")
            self.stack_depth += 1
            try:
                return Node(
                    "pipe",
                    "(...)",
                    args=[self.pipeline("parenthesized pipeline", Item.RIGHT_PAREN)],
                )
            finally:
                self.stack_depth -= 1
        if typ in (Item.STRING, Item.RAW_STRING):
            try:
                unquote(token.val)
            except TemplateError as exc:
                raise self.errorf(str(exc)) from None
            return Node("string", token.val)
        self.backup()
        return None


def _empty(node: Node | None) -> bool:
    """parse.IsEmptyTree."""
    if node is None or node.kind == "comment":
        return True
    if node.kind == "list":
        return all(_empty(n) for n in node.nodes)
    if node.kind == "text":
        return not node.text.strip(_GO_SPACE)
    return False


_GO_SPACE = "\t\n\v\f\r \x85\xa0"
"""bytes.TrimSpace: ASCII space, and U+0085 and U+00A0 where the text is valid UTF-8."""


def _pipeless_template(node: Node) -> bool:
    """Ollama's Identifiers refuses a {{template}} without a pipeline, wherever it is."""
    if node.kind == "template" and node.pipe is None:
        return True
    return any(_pipeless_template(n) for n in node.nodes)


def parse(text: str) -> None:
    """template/template.go Parse of a request's template: TemplateError with Go's words."""
    lexer = Lexer(text)
    trees: dict[str, _Tree] = {}
    tree = _Tree("", lexer, trees)
    tree.parse()
    tree.add()
    for found in trees.values():
        if found.root is not None and _pipeless_template(found.root):
            raise TemplateError("undefined template specified")
