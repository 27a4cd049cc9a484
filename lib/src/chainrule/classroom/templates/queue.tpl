{%- extends 'nbgrader/base.tpl' -%}

{%- block head -%}
<script>
var assignment_id = "{{ assignment_id }}";
</script>
<style>
  #queue-summary { font-size: 12px; white-space: pre; }
  .state-queued { color: #777; }
  .state-grading { color: #31708f; font-weight: bold; }
  #queue-counts .label { font-size: 100%; margin-right: 6px; }
</style>
{%- endblock head -%}

{%- block title -%}
Grade on the queue
{%- endblock -%}

{%- block sidebar -%}
<li role="presentation" class="active"><a href="{{ base_url }}/formgrader/manage_assignments">Manage Assignments</a></li>
<li role="presentation"><a href="{{ base_url }}/formgrader/gradebook">Manual Grading</a></li>
<li role="presentation"><a href="{{ base_url }}/formgrader/manage_students">Manage Students</a></li>
{%- endblock -%}

{%- block breadcrumbs -%}
<ol class="breadcrumb">
  <li><a href="{{ base_url }}/formgrader/manage_assignments">Assignments</a></li>
  <li><a href="{{ base_url }}/formgrader/manage_submissions/{{ assignment_id }}">{{ assignment_id }}</a></li>
  <li class="active">Grade on the queue</li>
</ol>
{%- endblock -%}

{%- block messages -%}
<p>
  Every collected submission of <b>{{ assignment_id }}</b> becomes one job on the course's task
  queue; the grading workers (on this machine or others) take them one at a time and grade each
  in its own sandbox. Grades go to the course's gradebook, feedback is generated (release it from
  <i>Manage Assignments</i>), and the grades are exported for the LMS.
</p>
<p>
  <button class="btn btn-primary" id="start-queue">Autograde all submissions</button>
  <span id="queue-status" class="text-muted"></span>
</p>
<p id="queue-counts"></p>
{%- endblock -%}

{%- block table_header -%}
<tr>
  <th>Student</th>
  <th>State</th>
  <th>Worker</th>
  <th>Attempt</th>
  <th>Time</th>
  <th>Result</th>
</tr>
{%- endblock -%}

{%- block table_footer -%}
<tr><td colspan="6"><pre id="queue-summary"></pre></td></tr>
{%- endblock -%}

{%- block script -%}
<script>
function fmt(s) {
  if (s === null || s === undefined) return "—";
  s = Math.round(s);
  return s < 60 ? s + " s" : Math.floor(s / 60) + " min " + (s % 60) + " s";
}
function render(data) {
  var rows = (data.students || []).map(function (s) {
    var cls = "state-" + s.state;
    return "<tr class='" + cls + "' data-student='" + _.escape(s.student) + "'>" +
      "<td class='student'>" + _.escape(s.student) + "</td>" +
      "<td class='state'>" + s.state + "</td>" +
      "<td>" + _.escape(s.worker || "") + "</td>" +
      "<td>" + (s.attempt || "") + "</td>" +
      "<td>" + (s.state === "done" ? s.seconds.toFixed(1) + " s" : "") + "</td>" +
      "<td class='status'>" + _.escape(s.status || "") + "</td></tr>";
  });
  $("#main-table").html(rows.join(""));
  if (data.total) {
    var c = data.counts;
    $("#queue-counts").html(
      "<span class='label label-default'>" + c.queued + " queued</span>" +
      "<span class='label label-info'>" + c.grading + " grading</span>" +
      "<span class='label label-success'>" + c.done + " of " + data.total + " done</span>" +
      "<span id='queue-time'>" + fmt(data.elapsed_s) + " elapsed, " +
      (data.finished ? "finished" : "about " + fmt(data.seconds_left) + " left") +
      (data.workers.length ? "; grading on " + _.escape(data.workers.join(", ")) : "") + "</span>");
  }
  $("#queue-status").text(data.running ? "grading…" : (data.finished ? "done" : ""));
  $("#start-queue").prop("disabled", !!data.running);
  $("#queue-summary").text(data.error ? data.error + "\n" + data.log : (data.summary || ""));
}
function poll() {
  // the hub takes a cookie-authenticated request only with its XSRF token
  $.ajax({
    url: base_url + "/formgrader/api/queue/" + assignment_id,
    headers: {"X-XSRFToken": getCookie("_xsrf")},
  }).done(function (text) {
    render(JSON.parse(text));
  });
}
$(function () {
  $("#start-queue").click(function () {
    $("#start-queue").prop("disabled", true);
    $.post(base_url + "/formgrader/api/queue/" + assignment_id).always(poll);
  });
  poll();
  setInterval(poll, 1000);
});
</script>
{%- endblock -%}
