"""How big code is: lines of code, not documentation (the size checks count these)."""

import ast
import io
import tokenize


def code_lines(text):
    """The number of lines holding code: no docstring, comment or blank line counts.

    A docstring is any bare string statement (a module's, a class's, a function's, an
    attribute's); a string that is part of code (a message constant) counts.
    """
    documentation = set()
    for node in ast.walk(ast.parse(text)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            documentation.update(range(node.lineno, node.end_lineno + 1))
    layout = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type not in layout | {tokenize.ENDMARKER}:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - documentation)
