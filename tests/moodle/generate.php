<?php
// Test data for the real-Moodle suite, made with Moodle's own generator and
// printed as one JSON object on stdout (what tests/real_moodle/site.rs reads):
// students with known passwords and names, one course they are enrolled in, a
// SCORM activity from a real package shipped with Moodle, a file resource, and
// for each student the keys of the token URL forms; and as many newcomers, enrolled
// the same way, for the surge (accounts of their own, so that a newcomer logging in
// never shares an account with a student already logged in); and a timed quiz of
// true/false questions, two a page, for the exam-start scenario.
//
//   MOODLE_DIRROOT=… (plus config.php's variables) php generate.php --students=N --newcomers=M
define('CLI_SCRIPT', true);
require(getenv('MOODLE_DIRROOT') . '/config.php');
require_once($CFG->libdir . '/clilib.php');
require_once($CFG->libdir . '/testing/generator/lib.php');

[$options] = cli_get_params(['students' => 24, 'newcomers' => 0]);
$count = (int) $options['students'];
$newcomers = (int) $options['newcomers'];

\core\session\manager::set_user(get_admin());

// What a scripted browser cannot get past: password rules and user tours.
set_config('passwordpolicy', 0);
$DB->set_field('tool_usertours_tours', 'enabled', 0);
// The app's URL forms (/webservice/pluginfile.php?token=) need web services on.
set_config('enablewebservices', 1);
set_config('enablemobilewebservice', 1);
$mobile = $DB->get_record('external_services', ['shortname' => MOODLE_OFFICIAL_MOBILE_SERVICE], '*', MUST_EXIST);
$DB->set_field('external_services', 'enabled', 1, ['id' => $mobile->id]);

// Moodle makes its encryption key (the username cookie's, among others) on first
// use, with a plain file_put_contents: a second login at that moment reads it half
// written and gets "Encryption failed". A site in service has had its key since its
// first login; so does this one.
if (!\core\encryption::key_exists()) {
    \core\encryption::create_key();
}

$gen = new testing_data_generator();
$course = $gen->create_course(['fullname' => 'Gateway course', 'shortname' => 'gwcourse']);

$package = 'mod/scorm/tests/packages/singlesco_scorm12.zip';
$scorm = $gen->create_module('scorm', ['course' => $course->id, 'name' => 'Golf etiquette',
    'packagefilepath' => $CFG->dirroot . '/' . $package]);
$scormcontext = context_module::instance($scorm->cmid);
$scorm->revision = $DB->get_field('scorm', 'revision', ['id' => $scorm->id], MUST_EXIST);

$resource = $gen->create_module('resource', ['course' => $course->id, 'name' => 'Gateway handout',
    'uploaded' => 1, 'defaultfilename' => 'lib/tests/fixtures/gd-logo.png']);
$resourcecontext = context_module::instance($resource->cmid);

$fs = get_file_storage();
$file = fn(stored_file $f) => [
    'path' => ltrim($f->get_filepath() . $f->get_filename(), '/'),
    'contenthash' => $f->get_contenthash(),
    'size' => (int) $f->get_filesize(),
    'mimetype' => $f->get_mimetype(),
];
$content = array_map($file, array_values(
    $fs->get_area_files($scormcontext->id, 'mod_scorm', 'content', 0, 'filepath, filename', false)));
$resourcefiles = array_values(
    $fs->get_area_files($resourcecontext->id, 'mod_resource', 'content', 0, 'filepath, filename', false));
$resourcefile = $file($resourcefiles[0]);
$resourcefile['url'] = '/pluginfile.php/' . $resourcecontext->id . '/mod_resource/content/'
    . $resource->revision . '/' . rawurlencode($resourcefiles[0]->get_filename());

// The quiz: a time limit (so Moodle asks for a confirmation before the attempt
// starts), QUIZ_QUESTIONS true/false questions, QUIZ_PER_PAGE a page. The questions
// are made through the question type's own save_question(), as the question editing
// form does: Moodle's question generator needs PHPUnit's environment.
require_once($CFG->dirroot . '/mod/quiz/locallib.php');
require_once($CFG->libdir . '/questionlib.php');
const QUIZ_QUESTIONS = 10;
const QUIZ_PER_PAGE = 2;
$quiz = $gen->create_module('quiz', ['course' => $course->id, 'name' => 'Gateway exam',
    'timelimit' => 30 * 60, 'questionsperpage' => QUIZ_PER_PAGE, 'grade' => QUIZ_QUESTIONS,
    'preferredbehaviour' => 'deferredfeedback', 'shuffleanswers' => 0]);
$quizcontext = context_module::instance($quiz->cmid);
$category = question_make_default_categories([$quizcontext]);
$questions = [];
for ($n = 1; $n <= QUIZ_QUESTIONS; $n++) {
    $right = $n % 2;
    $form = (object) [
        'category' => $category->id . ',' . $category->contextid,
        'name' => "Gateway question $n",
        'questiontext' => ['format' => FORMAT_HTML, 'text' => "Statement $n is " . ($right ? 'true' : 'false') . '.'],
        'generalfeedback' => ['format' => FORMAT_HTML, 'text' => ''],
        'defaultmark' => 1,
        'penalty' => 1,
        'correctanswer' => (string) $right,
        'feedbacktrue' => ['format' => FORMAT_HTML, 'text' => ''],
        'feedbackfalse' => ['format' => FORMAT_HTML, 'text' => ''],
        'status' => \core_question\local\bank\question_version_status::QUESTION_STATUS_READY,
    ];
    $question = (object) ['qtype' => 'truefalse', 'createdby' => 0, 'idnumber' => null,
        'status' => $form->status];
    $question = question_bank::get_qtype('truefalse')->save_question($question, $form);
    quiz_add_quiz_question($question->id, $quiz);
    $questions[] = ['id' => (int) $question->id, 'right' => (string) $right];
}
\mod_quiz\quiz_settings::create($quiz->id)->get_grade_calculator()->recompute_quiz_sumgrades();
$slots = $DB->get_records('quiz_slots', ['quizid' => $quiz->id], 'slot');
$byslot = [];
foreach ($slots as $slot) {
    $entry = $DB->get_record('question_references', ['component' => 'mod_quiz',
        'questionarea' => 'slot', 'itemid' => $slot->id], '*', MUST_EXIST);
    $version = $DB->get_record('question_versions', ['questionbankentryid' => $entry->questionbankentryid],
        '*', MUST_EXIST);
    $right = array_values(array_filter($questions, fn($q) => $q['id'] == $version->questionid))[0]['right'];
    // Moodle numbers pages from 1 here, and from 0 in attempt.php's page parameter.
    $byslot[] = ['slot' => (int) $slot->slot, 'page' => (int) $slot->page - 1,
        'question_id' => (int) $version->questionid, 'right' => $right];
}

$scoes = $DB->get_records('scorm_scoes', ['scorm' => $scorm->id, 'scormtype' => 'sco'], 'sortorder');
$sco = reset($scoes);

// One account: username $prefix$n, password "Prefix-pass-$n", a last name no other
// account's contains (the pages are checked for other students' names).
$account = function (string $prefix, string $first, string $last, string $n) use ($gen, $course, $mobile) {
    $password = ucfirst($prefix) . "-pass-$n";
    $user = $gen->create_user(['username' => "$prefix$n", 'password' => $password,
        'firstname' => $first, 'lastname' => "$last$n", 'email' => "$prefix$n@example.com"]);
    $gen->enrol_user($user->id, $course->id, 'student');
    $wstoken = \core_external\util::generate_token(EXTERNAL_TOKEN_PERMANENT, $mobile, $user->id,
        context_system::instance());
    return [
        'id' => (int) $user->id,
        'username' => $user->username,
        'password' => $password,
        'fullname' => fullname($user),
        'files_key' => get_user_key('core_files', $user->id),
        'ws_token' => $wstoken,
    ];
};
$students = [];
for ($i = 1; $i <= $count; $i++) {
    $students[] = $account('student', 'Ada', 'Gatewaytester', sprintf('%02d', $i));
}
$arrivals = [];
for ($i = 1; $i <= $newcomers; $i++) {
    $arrivals[] = $account('newcomer', 'Ben', 'Surgetester', sprintf('%03d', $i));
}

echo json_encode([
    'course_id' => (int) $course->id,
    'scorm' => [
        'id' => (int) $scorm->id,
        'cmid' => (int) $scorm->cmid,
        'context_id' => (int) $scormcontext->id,
        'revision' => (int) $scorm->revision,
        'package' => $package,
        'launch_path' => $sco->launch,
        'content' => $content,
    ],
    'resource' => [
        'cmid' => (int) $resource->cmid,
        'context_id' => (int) $resourcecontext->id,
        'file' => $resourcefile,
    ],
    'quiz' => [
        'id' => (int) $quiz->id,
        'cmid' => (int) $quiz->cmid,
        'timelimit' => 30 * 60,
        'pages' => (int) ceil(QUIZ_QUESTIONS / QUIZ_PER_PAGE),
        'slots' => $byslot,
    ],
    'students' => $students,
    'newcomers' => $arrivals,
], JSON_PRETTY_PRINT | JSON_UNESCAPED_SLASHES) . "\n";
