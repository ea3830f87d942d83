<?php
// Adds a file resource with one large file to the suite's course, for the offload
// measure (tests/real_moodle.rs, measure_offload_*), and prints it as JSON like
// generate.php's resource file. Run against a restored site, never the cached one.
//
//   MOODLE_DIRROOT=… (plus config.php's variables) php bigfile.php --mib=50
define('CLI_SCRIPT', true);
require(getenv('MOODLE_DIRROOT') . '/config.php');
require_once($CFG->libdir . '/clilib.php');
require_once($CFG->libdir . '/testing/generator/lib.php');
require_once($CFG->libdir . '/filelib.php');

[$options] = cli_get_params(['mib' => 50]);
$size = (int) $options['mib'] * 1024 * 1024;

\core\session\manager::set_user(get_admin());
$course = $DB->get_record('course', ['shortname' => 'gwcourse'], '*', MUST_EXIST);

// Incompressible bytes, so that nothing on the way can make the transfer cheaper.
$source = make_request_directory() . '/lecture.mp4';
$out = fopen($source, 'wb');
for ($written = 0; $written < $size; $written += 1024 * 1024) {
    fwrite($out, random_bytes(1024 * 1024));
}
fclose($out);

$draft = file_get_unused_draft_itemid();
$fs = get_file_storage();
$fs->create_file_from_pathname(['component' => 'user', 'filearea' => 'draft',
    'contextid' => context_user::instance($USER->id)->id, 'itemid' => $draft,
    'filename' => 'lecture.mp4', 'filepath' => '/'], $source);

$gen = new testing_data_generator();
$resource = $gen->create_module('resource', ['course' => $course->id, 'name' => 'Big lecture',
    'files' => $draft]);
$context = context_module::instance($resource->cmid);
$files = array_values($fs->get_area_files($context->id, 'mod_resource', 'content', 0, 'filename', false));
$f = $files[0];
echo json_encode([
    'path' => $f->get_filename(),
    'contenthash' => $f->get_contenthash(),
    'size' => (int) $f->get_filesize(),
    'mimetype' => $f->get_mimetype(),
    'url' => '/pluginfile.php/' . $context->id . '/mod_resource/content/' . $resource->revision
        . '/' . rawurlencode($f->get_filename()),
], JSON_UNESCAPED_SLASHES) . "\n";
