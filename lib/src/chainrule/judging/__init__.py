"""Judging a notebook without trusting it: the test cells run in the grader, not in the kernel.

At grading time (:mod:`chainrule.grading.execute`) a student's kernel runs the student's cells
and nothing else. The instructor's test cells run in the grader's own process
(:class:`~chainrule.judging.judge.Judge`), and reach the student's code only through requests
that the kernel answers with plain values (:mod:`~chainrule.judging.agent`,
:mod:`~chainrule.judging.wire`). The reference values, the comparisons and the verdicts never
enter the student's kernel, so nothing the student's code does there can change them.
:mod:`~chainrule.judging.source_scan` reads the student's source for library solutions and for
code that reaches into the kernel or the grader.

In a student's own notebook (Validate, or plain nbgrader) the same test cells simply run in the
kernel: :func:`chainrule.course.checks.in_student_kernel` is then an ordinary function call.
"""
