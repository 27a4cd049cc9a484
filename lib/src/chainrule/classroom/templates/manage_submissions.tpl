{%- extends 'nbgrader/manage_submissions.tpl' -%}

{%- block messages -%}
<p>
  <a class="btn btn-primary" id="grade-on-queue" href="{{ base_url }}/formgrader/queue/{{ assignment_id }}">
    Grade on the queue&hellip;
  </a>
  <span class="text-muted">Every submission graded by the course's workers, each in its sandbox, with progress.</span>
</p>
{{ super() }}
{%- endblock -%}
